#!/usr/bin/env bash
# Model::fit under ParameterServerStrategy side by side with TensorFlow's, one after the other in
# one invocation: ps_trainer (fit, one step per closure, the variables in one shard each) under
# troupe-launch (chief, 2 workers, 1 ps), then bench/tf_ps_fit.py (tf.distribute.Server processes,
# the same shape, model, batch, optimizer and number of steps), then the ratio of samples/s and
# both losses after equal steps (the means of the last 10 steps).
#   bench/ps_fit_bench.sh [BUILD_DIR] [STEPS] [sgd|adam]
# TensorFlow comes from $TROUPE_BENCH_VENV (default /opt/troupe-bench; tools/install-deps.sh --bench).
set -euo pipefail
build="${1:-build}"
steps="${2:-400}"
optimizer="${3:-sgd}"
lr=0.05
[ "$optimizer" = sgd ] || lr=0.01
python="${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$build/tools/troupe-launch" --timeout 600 --chief --ps 1 -n 2 --ranks 0 -- "$build/examples/ps_trainer" \
  --closures "$steps" --optimizer "$optimizer" --lr "$lr" --batch 64 --shards 1 | sed 's/^\[rank 0\] //' \
  | grep -E '^(ps_trainer: [0-9]+ steps|result: )' | tee "$out/troupe.txt"
"$python" "$(dirname "$0")/tf_ps_fit.py" --steps "$steps" --optimizer "$optimizer" --lr "$lr" 2>/dev/null \
  | grep '^tensorflow: ' | tee "$out/tf.txt"
python3 - "$out/troupe.txt" "$out/tf.txt" <<'PY'
import re, sys
t, f = open(sys.argv[1]).read(), open(sys.argv[2]).read()
rate = lambda s: float(re.search(r"([\d.e+]+) samples/s", s).group(1))
last = lambda s: float(re.search(r"loss_last=([\d.e+-]+)", s).group(1))
print("| what | troupe | TensorFlow | troupe / TensorFlow |\n|---|---|---|---|")
print("| samples/s | %.0f | %.0f | %.1fx |" % (rate(t), rate(f), rate(t) / rate(f)))
print("| loss of the last 10 steps | %.4f | %.4f | |" % (last(t), last(f)))
PY
