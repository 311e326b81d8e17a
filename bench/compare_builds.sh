#!/usr/bin/env bash
# Two builds of troupe side by side, interleaved round by round (so that a noisy neighbour hits
# both alike): a change's cost, measured against the commit before it.
#
#   bench/compare_builds.sh BEFORE_BUILD AFTER_BUILD [ROUNDS]
#
# Each round runs, on each build in turn:
#   - collectives in a process: allreduce_shm_bench at 4 KiB and 4 MiB over 2 and 4 replicas;
#   - run: strategy_run_bench, the fixed cost of one Strategy::run over 1, 2 and 4 replicas;
#   - collectives across processes: tcp_allreduce_bench, 2 ranks, 4 KiB, 1 MiB and 16 MiB;
#   - training: mlp_classifier's generated set, 2 replicas, batch 256, cached input (samples/s);
#   - cluster: cluster_bench under troupe-launch (chief, 2 workers, 1 ps): empty closures/s,
#     4 KiB and 16 MiB reads.
# It prints every case's median over the rounds for both builds and after / before (a time: below
# 1 is faster; a rate: above 1 is faster), with the range of the rounds.
set -euo pipefail
before=${1:?BEFORE_BUILD}
after=${2:?AFTER_BUILD}
rounds=${3:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

one_round() {  # build tag
  local b=$1 tag=$2
  "$b/bench/allreduce_shm_bench" --benchmark_filter='BM_AllReduce_Shm/(4096|4194304)/(2|4)/' \
    --benchmark_format=json 2>/dev/null |
    python3 -c 'import json,sys
for r in json.load(sys.stdin)["benchmarks"]: print("time_us shm %s %.3f" % (r["name"], r["real_time"] * (1e-3 if r["time_unit"]=="ns" else 1)))' >>"$out/$tag"
  "$b/bench/strategy_run_bench" --benchmark_filter='BM_StrategyRun/(1|2|4)/' --benchmark_format=json 2>/dev/null |
    python3 -c 'import json,sys
for r in json.load(sys.stdin)["benchmarks"]: print("time_us run %s %.3f" % (r["name"], r["real_time"] * (1e-3 if r["time_unit"]=="ns" else 1)))' >>"$out/$tag"
  "$b/bench/tcp_allreduce_bench" -n 2 4096 1048576 16777216 2>/dev/null |
    sed -n 's/^tcp_allreduce bytes=\([0-9]*\) ranks=\([0-9]*\) .*median_us=\([0-9.]*\).*/time_us tcp_ring_\2_ranks\/\1 \3/p' >>"$out/$tag" || true
  "$b/examples/mlp_classifier" --epochs 4 --replicas 2 --batch 256 --cached-batches --quiet 2>/dev/null |
    sed -n 's/.*samples_per_s=\([0-9.e+]*\).*/rate training_2_replicas \1/p' >>"$out/$tag" || true
  "$b/tools/troupe-launch" --timeout 300 --chief --ps 1 -n 2 --ranks 0 -- "$b/bench/cluster_bench" --rounds 1 2>/dev/null |
    sed 's/^\[rank 0\] //' | python3 -c 'import re,sys
for line in sys.stdin:
    m = re.match(r"troupe (empty closures|read 4096 bytes|read 16777216 bytes).*?: ([\d.]+) (closures/s|MB/s)", line)
    if m: print("rate cluster_%s %s" % (m.group(1).replace(" ", "_"), m.group(2)))' >>"$out/$tag" || true
}

for ((r = 1; r <= rounds; ++r)); do
  echo "round $r of $rounds" >&2
  one_round "$before" before
  one_round "$after" after
done

python3 - "$out/before" "$out/after" <<'PY'
import statistics, sys
def load(p):
    d = {}
    for line in open(p):
        kind, name, value = line.split()[0], " ".join(line.split()[1:-1]), float(line.split()[-1])
        d.setdefault((kind, name), []).append(value)
    return d
b, a = load(sys.argv[1]), load(sys.argv[2])
print("| case | before | after | after / before | range before | range after |\n|---|---|---|---|---|---|")
for k in b:
    if k not in a: continue
    mb, ma = statistics.median(b[k]), statistics.median(a[k])
    unit = "us" if k[0] == "time_us" else "/s"
    print("| %s (%s) | %.4g | %.4g | %.3f | %.4g-%.4g | %.4g-%.4g |" % (k[1], unit, mb, ma, ma / mb, min(b[k]), max(b[k]), min(a[k]), max(a[k])))
PY
