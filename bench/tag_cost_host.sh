#!/usr/bin/env bash
# The frame integrity tags' cost on a bigger host, in one command: bench/tag_cost.sh (the ring
# untagged and tagged, alternated round by round) for 2 and 8 ranks, frame_tag_bench (the tag
# alone, and OpenSSL's alternatives, GB/s) and bulk_tag_bench (a ps data connection's shard read
# and update untagged, tagged in line and tagged beside, with the CPU per operation) when packed. With one pack the tagged runs hash in line
# (on the rank's thread) and beside it (a thread of its own), side by side; with two, each pack's
# default against the other's (a pack from before --tag-hashing, say). Prints the tables and
# writes them to OUT/tag_cost_host.txt; exits 1 when a run fails.
#
#   bench/tag_cost_host.sh BIN_DIR [OTHER_BIN_DIR] [OUT]
#     BIN_DIR: a pack's bin/ (tools/pack-gpu.sh; its ../lib is used) or a build folder; with two
#     arguments the second is OTHER_BIN_DIR when it holds tcp_allreduce_bench, else OUT (made);
#     with three, an empty OTHER_BIN_DIR ("") means one pack
#   env: NPROCS="2 8" ROUNDS=5 SIZES="1048576 4194304 16777216 67108864"
#        HASHING (one pack: "inline beside"; see tag_cost.sh) BENCH_FILTER (frame_tag_bench's)
#        BULK_FILTER (bulk_tag_bench's)
set -uo pipefail

[[ $# -ge 1 && $# -le 3 ]] || { echo "usage: bench/tag_cost_host.sh BIN_DIR [OTHER_BIN_DIR] [OUT]" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# A folder with tcp_allreduce_bench (a pack's bin/ or a build folder's bench/ beside it).
is_bin() { [[ -x $1/tcp_allreduce_bench || -x $1/bench/tcp_allreduce_bench ]]; }
is_bin "$1" || { echo "tag_cost_host: no tcp_allreduce_bench in $1 (a pack's bin/ or a build folder)" >&2; exit 2; }
bins=("$(cd "$1" && pwd)") || exit 2
out=./tag-cost-host
if [[ $# == 3 ]]; then
  # An empty OTHER_BIN_DIR: one pack, the results in OUT.
  if [[ -n $2 ]]; then
    is_bin "$2" || { echo "tag_cost_host: no tcp_allreduce_bench in $2 (a pack's bin/ or a build folder)" >&2; exit 2; }
    bins+=("$(cd "$2" && pwd)") || exit 2
  fi
  out=$3
elif [[ $# == 2 ]]; then
  # One pack and where the results go, or two packs: the second argument says which.
  if is_bin "$2"; then bins+=("$(cd "$2" && pwd)") || exit 2; else out=$2; fi
fi
mkdir -p "$out" || exit 2
report=$out/tag_cost_host.txt
: >"$report"
failed=0
for b in "${bins[@]}"; do
  tb=$b/frame_tag_bench
  [[ -x $tb ]] || tb=$b/bench/frame_tag_bench
  [[ -x $tb ]] || { echo "tag_cost_host: no frame_tag_bench in $b: the ring alone" | tee -a "$report"; continue; }
  lib=
  [[ -d $b/../lib ]] && lib=$(cd "$b/../lib" && pwd)
  echo "frame_tag_bench ($b)" | tee -a "$report"
  LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tb" --benchmark_min_time=0.2 --benchmark_filter="${BENCH_FILTER:-.}" 2>&1 |
    grep -E '^(BM_|Run on|Benchmark)' | tee -a "$report" || failed=1
  bb=$b/bulk_tag_bench
  [[ -x $bb ]] || bb=$b/bench/bulk_tag_bench
  [[ -x $bb ]] || { echo "tag_cost_host: no bulk_tag_bench in $b: no ps data connection rows" | tee -a "$report"; continue; }
  echo "bulk_tag_bench ($b): <bytes>/<0 untagged, 1 in line, 2 beside>" | tee -a "$report"
  LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$bb" --benchmark_min_time=0.3 --benchmark_filter="${BULK_FILTER:-.}" 2>&1 |
    grep -E '^(BM_|Benchmark)' | tee -a "$report" || failed=1
done
if [[ ${#bins[@]} == 1 ]]; then export HASHING=${HASHING-inline beside}; fi
for n in ${NPROCS:-2 8}; do
  echo | tee -a "$report"
  RANKS=$n "$here/tag_cost.sh" "${bins[@]}" 2>&1 | tee -a "$report"
  [[ ${PIPESTATUS[0]} == 0 ]] || failed=1
done
echo "tag_cost_host: written to $report"
exit $failed
