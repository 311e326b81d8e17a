#!/usr/bin/env bash
# ClusterCoordinator side by side with TensorFlow's, one after the other in one invocation:
# troupe's cluster_bench under troupe-launch (chief, 2 workers, 1 ps), then bench/tf_ps.py
# (tf.distribute.Server processes, same shape), then the ratios.
#   bench/cluster_bench.sh [BUILD_DIR] [ROUNDS]
# TensorFlow comes from $TROUPE_BENCH_VENV (default /opt/troupe-bench; tools/install-deps.sh --bench).
set -euo pipefail
build="${1:-build}"
rounds="${2:-5}"
python="${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$build/tools/troupe-launch" --timeout 600 --chief --ps 1 -n 2 --ranks 0 -- "$build/bench/cluster_bench" \
  --rounds "$rounds" | sed 's/^\[rank 0\] //' | grep '^troupe ' | tee "$out/troupe.txt"
"$python" "$(dirname "$0")/tf_ps.py" --rounds "$rounds" 2>/dev/null | grep '^tensorflow ' | tee "$out/tf.txt"
python3 - "$out/troupe.txt" "$out/tf.txt" <<'PY'
import re, sys
def load(path):
    d = {}
    for line in open(path):
        m = re.match(r"\w+ (empty closures|read \d+ bytes|update \d+ bytes|lookup \d+ rows|scatter \d+ rows).*?: ([\d.]+) (closures/s|MB/s)", line)
        if m: d[m.group(1)] = float(m.group(2))
    return d
t, f = load(sys.argv[1]), load(sys.argv[2])
print("| what | troupe | TensorFlow | troupe / TensorFlow |\n|---|---|---|---|")
for k in t:
    if k in f:
        unit = "closures/s" if k.startswith("empty") else "MB/s"
        print("| %s | %.0f %s | %.0f %s | %.1fx |" % (k, t[k], unit, f[k], unit, t[k] / f[k]))
PY
