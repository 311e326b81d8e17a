#!/usr/bin/env bash
# troupe's remote actor request side by side with Ray's actor calls, one after the other in one
# invocation: bench/actor_bench (plain loopback, then TLS from a cluster token), then
# bench/ray_actor_bench.py, then the ratios and the goals (bench/results/actors.md).
#   bench/actor_bench.sh [BUILD_DIR]
# Ray comes from $TROUPE_BENCH_VENV (default /opt/troupe-bench; tools/install-deps.sh --bench).
set -euo pipefail
build="${1:-build}"
python="${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$build/bench/actor_bench" | tee "$out/troupe.txt"
"$build/bench/actor_bench" --token | tee -a "$out/troupe.txt"
"$python" "$(dirname "$0")/ray_actor_bench.py" 2>/dev/null | grep '^ray ' | tee "$out/ray.txt"
python3 - "$out/troupe.txt" "$out/ray.txt" <<'PY'
import re, sys
def load(path):
    d = {}
    for line in open(path):
        m = re.match(r"(?:troupe|ray) (.*?): ([\d.]+)(?: |$)", line.rstrip())
        if m: d[m.group(1)] = float(m.group(2))
    return d
t, r = load(sys.argv[1]), load(sys.argv[2])
rt = t["sync round trip (plain)"]
print("| what | troupe plain | troupe TLS | Ray | troupe plain vs Ray |\n|---|---|---|---|---|")
print("| sync round trip (median) | %.1f us | %.1f us | %.1f us | %.1fx faster |" % (
    rt, t["sync round trip (TLS)"], r["sync round trip"], r["sync round trip"] / rt))
print("| async requests, 1000 in flight | %.0f /s | %.0f /s | %.0f /s | %.1fx |" % (
    t["async requests (plain)"], t["async requests (TLS)"], r["async requests"], t["async requests (plain)"] / r["async requests"]))
print("| one-way sends / Ray all at once | %.0f /s | %.0f /s | %.0f /s | %.1fx |" % (
    t["one-way sends (plain)"], t["one-way sends (TLS)"], r["async all at once"], t["one-way sends (plain)"] / r["async all at once"]))
print("| 1 MiB round trip (median) | %.0f us | %.0f us | %.0f us | %.1fx faster |" % (
    t["1 MiB round trip (plain)"], t["1 MiB round trip (TLS)"], r["1 MiB round trip"], r["1 MiB round trip"] / t["1 MiB round trip (plain)"]))
print("\ngoals: round trip <= 50 us: %s (%.1f us); >= 200k small messages/s: async %s (%.0f), sends %s (%.0f); "
      "1 MiB >= 0.7 of the loopback floor: %s (%.2f)" % (
    "met" if rt <= 50 else "missed", rt,
    "met" if t["async requests (plain)"] >= 2e5 else "missed", t["async requests (plain)"],
    "met" if t["one-way sends (plain)"] >= 2e5 else "missed", t["one-way sends (plain)"],
    "met" if t["1 MiB share of the floor (plain)"] >= 0.7 else "missed", t["1 MiB share of the floor (plain)"]))
PY
