#!/usr/bin/env bash
# The cost of the frame integrity tags, side by side in one invocation: tcp_allreduce_bench
# without and with --token (every frame tagged), alternated round by round, and the same for a
# second build when one is given (a change to the tags measured against the commit before it).
# Prints per size the median over the rounds of each run's median time, and tagged / untagged; then
# the same for the CPU time per operation (all ranks together), which a loaded machine disturbs
# less than the time.
#
#
#   bench/tag_cost.sh BUILD [OTHER_BUILD]   env: ROUNDS=5 RANKS=2 SIZES="1048576 ... 67108864"
#                                           HASHING="inline beside" (a tagged column for each of
#                                           tcp_allreduce_bench's --tag-hashing modes; unset: the
#                                           build's default, and builds without the option)
# BUILD: a build folder (BUILD/bench/tcp_allreduce_bench) or a pack's bin/ (tools/pack-gpu.sh; its
# ../lib is used).
set -euo pipefail
builds=("${1:?BUILD}")
[ -n "${2:-}" ] && builds+=("$2")
programs=()
libs=()
for b in "${builds[@]}"; do
  p=$b/bench/tcp_allreduce_bench
  [ -x "$p" ] || p=$b/tcp_allreduce_bench
  [ -x "$p" ] || { echo "tag_cost: no tcp_allreduce_bench in $b or $b/bench" >&2; exit 2; }
  programs+=("$p")
  l=
  [ -d "$b/../lib" ] && l=$(cd "$b/../lib" && pwd)
  libs+=("$l")
done
rounds=${ROUNDS:-5}
ranks=${RANKS:-2}
hashing=${HASHING:-}
tagged=(tagged)
[ -n "$hashing" ] && { tagged=(); for m in $hashing; do tagged+=("tagged-$m"); done; }
sizes=${SIZES:-1048576 4194304 16777216 67108864}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg); $ranks ranks"
for ((r = 1; r <= rounds; ++r)); do
  for i in "${!builds[@]}"; do
    for tag in plain "${tagged[@]}"; do
      flag=()
      [ "$tag" != plain ] && flag=(--token tag-cost-bench)
      [ "${tag#tagged-}" != "$tag" ] && flag+=(--tag-hashing "${tag#tagged-}")
      LD_LIBRARY_PATH=${libs[$i]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "${programs[$i]}" -n "$ranks" --reps 3 --target-ms 100 "${flag[@]}" $sizes |
        sed -n "s/^tcp_allreduce bytes=\([0-9]*\) .*median_us=\([0-9.]*\) .*cpu_us=\([0-9.]*\).*/$i $tag \1 \2 \3/p" >>"$out/runs"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out/runs" "${tagged[*]}" "${builds[@]}" <<'PY'
import statistics, sys
runs, tagged, builds = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
d, c = {}, {}
for line in open(runs):
    b, tag, size, us, cpu = line.split()
    d.setdefault((int(b), tag, int(size)), []).append(float(us))
    c.setdefault((int(b), tag, int(size)), []).append(float(cpu))
def fmt(us): return f"{us/1000:.2f} ms" if us >= 1000 else f"{us:.0f} us"
for what, table in (("time per all-reduce (slowest rank)", d), ("CPU per all-reduce (all ranks)", c)):
    print(f"\n{what}")
    head = "| size |"
    for b in builds:
        head += f" {b}: untagged |" + "".join(f" {t} | {t} / untagged |" for t in tagged)
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for size in sorted({k[2] for k in table}):
        row = f"| {size // 1024 ** 2} MiB |" if size >= 1024 ** 2 else f"| {size} B |"
        for i in range(len(builds)):
            p = statistics.median(table[(i, "plain", size)])
            row += f" {fmt(p)} |"
            for tag in tagged:
                t = statistics.median(table[(i, tag, size)])
                row += f" {fmt(t)} | {t / p:.2f} |"
        print(row)
PY
