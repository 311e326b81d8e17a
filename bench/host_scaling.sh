#!/usr/bin/env bash
# On a bigger host, side by side in one invocation:
#   1. the ring across processes: tcp_allreduce_bench against torch.distributed.all_reduce over
#      Gloo (bench/torch_gloo_allreduce.py), float32 SUM, N local processes, alternated per N;
#   2. fit in one process: mlp_classifier with 1, 8 and 16 CPU replicas (--cached-batches, SGD)
#      against PyTorch with 16 threads (bench/torch_mlp.py --device cpu).
# Prints both tables (median over rounds; ratios troupe / peer, > 1 is troupe faster) and writes
# them to OUT/host_scaling.txt, every run's output under OUT/runs/. Exits 1 when a run fails.
#
#   bench/host_scaling.sh BIN_DIR [OUT]     BIN_DIR: a pack's bin/ (tools/pack-gpu.sh; its ../lib
#                                           is used) or a build tree's (BUILD/bench and BUILD/examples)
#   env: NPROCS="2 4 8" SIZES="4096 1048576 16777216 67108864" REPS=3 ROUNDS=2 EPOCHS=4
#        REPLICAS="1 8 16" THREADS=16 CASES="784-256-10:256 784-1024-10:4096" PYTHON=python3
set -uo pipefail

[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: bench/host_scaling.sh BIN_DIR [OUT]" >&2; exit 2; }
bin=$(cd "$1" && pwd) || exit 2
out=${2:-./host-scaling}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
nprocs=${NPROCS:-"2 4 8"}
sizes=${SIZES:-"4096 1048576 16777216 67108864"}
reps=${REPS:-3}
rounds=${ROUNDS:-2}
epochs=${EPOCHS:-4}
replicas_list=${REPLICAS:-"1 8 16"}
threads=${THREADS:-16}
cases=${CASES:-"784-256-10:256 784-1024-10:4096"}
ring=$bin/tcp_allreduce_bench
trainer=$bin/mlp_classifier
[[ -x $ring ]] || ring=$bin/bench/tcp_allreduce_bench
[[ -x $trainer ]] || trainer=$bin/examples/mlp_classifier
[[ -x $ring && -x $trainer ]] || { echo "host_scaling: no tcp_allreduce_bench and mlp_classifier in $bin" >&2; exit 2; }
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH=$(cd "$bin/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out/runs" || exit 2
have_torch=1
"$python" -c "import torch, torch.distributed" 2>/dev/null || have_torch=0
[[ $have_torch == 1 ]] || echo "host_scaling: PyTorch not found in $python: troupe alone"

failed=0
run() {  # run LOG CMD...: runs, keeps the output, notes a failure
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "host_scaling: failed: $* (see $log)" >&2
    tail -3 "$log" >&2
    failed=1
  fi
}
value() {  # value FILE PREFIX BYTES RANKS FIELD
  awk -v p="$2" -v b="bytes=$3" -v r="ranks=$4" -v f="$5=" '$1 == p && $2 == b && $3 == r {
    for (i = 1; i <= NF; ++i) if (index($i, f) == 1) print substr($i, length(f) + 1) }' "$1"
}
field() { sed -n 's/^result: .*\b'"$1"'=\([^ ]*\).*/\1/p' "$2" | tail -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "machine: $(nproc) CPUs, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')" | tee "$out/host_scaling.txt"
declare -A times
for ((round = 1; round <= rounds; ++round)); do
  for n in $nprocs; do
    # shellcheck disable=SC2086  # the list of sizes
    run "$out/runs/troupe-$n-$round.txt" "$ring" -n "$n" --reps "$reps" --target-ms 30 $sizes
    if [[ $have_torch == 1 ]]; then
      # shellcheck disable=SC2086
      run "$out/runs/gloo-$n-$round.txt" "$python" "$here/torch_gloo_allreduce.py" -n "$n" --reps "$reps" \
        --target-ms 30 $sizes
    fi
    for s in $sizes; do
      times[troupe:$n:$s]+="$(value "$out/runs/troupe-$n-$round.txt" tcp_allreduce "$s" "$n" median_us) "
      [[ $have_torch == 1 ]] &&
        times[gloo:$n:$s]+="$(value "$out/runs/gloo-$n-$round.txt" gloo_allreduce "$s" "$n" median_us) "
    done
  done
done
{
  echo
  echo "The ring across processes: time per all-reduce (us), median over $rounds rounds of medians of $reps"
  printf '%-6s %-10s %12s %12s %8s\n' ranks bytes troupe gloo "gloo/troupe"
  for n in $nprocs; do
    for s in $sizes; do
      # shellcheck disable=SC2086
      t=$(median ${times[troupe:$n:$s]:-})
      # shellcheck disable=SC2086
      g=$(median ${times[gloo:$n:$s]:-})
      ratio=$(awk -v t="${t:-0}" -v g="${g:-0}" 'BEGIN {if (t > 0 && g > 0) printf "%.2fx", g / t; else print "-"}')
      printf '%-6s %-10s %12s %12s %8s\n' "$n" "$s" "${t:--}" "${g:--}" "$ratio"
    done
  done
} | tee -a "$out/host_scaling.txt"

declare -A rate
for ((round = 1; round <= rounds; ++round)); do
  for c in $cases; do
    shape=${c%%:*}
    batch=${c#*:}
    IFS=- read -r features hidden classes <<<"$shape"
    for r in $replicas_list; do
      log=$out/runs/fit-$shape-$batch-r$r-$round.txt
      run "$log" "$trainer" --replicas "$r" --quiet --cached-batches --optimizer sgd --lr 0.01 --epochs "$epochs" \
        --batch "$batch" --samples $((batch * 16)) --features "$features" --hidden "$hidden" --classes "$classes"
      rate[troupe:$c:$r]+="$(field samples_per_s "$log") "
    done
    if [[ $have_torch == 1 ]]; then
      log=$out/runs/torch-$shape-$batch-$round.txt
      run "$log" "$python" "$here/torch_mlp.py" --device cpu --threads "$threads" --batch "$batch" --batches 16 \
        --epochs "$epochs" --features "$features" --hidden "$hidden" --classes "$classes" --lr 0.01
      rate[torch:$c]+="$(field samples_per_s "$log") "
    fi
  done
done
{
  echo
  echo "fit in one process: samples/s, median over $rounds rounds (troupe: CPU replicas; PyTorch: $threads threads)"
  printf '%-16s %-6s %-9s %12s %12s %10s %12s\n' model batch replicas troupe "vs 1 repl." torch "vs torch"
  for c in $cases; do
    shape=${c%%:*}
    batch=${c#*:}
    IFS=- read -r features hidden classes <<<"$shape"
    # shellcheck disable=SC2086
    one=$(median ${rate[troupe:$c:1]:-})
    # shellcheck disable=SC2086
    p=$(median ${rate[torch:$c]:-})
    for r in $replicas_list; do
      # shellcheck disable=SC2086
      t=$(median ${rate[troupe:$c:$r]:-})
      vs1=$(awk -v t="${t:-0}" -v o="${one:-0}" 'BEGIN {if (t > 0 && o > 0) printf "%.2fx", t / o; else print "-"}')
      vsp=$(awk -v t="${t:-0}" -v p="${p:-0}" 'BEGIN {if (t > 0 && p > 0) printf "%.2fx", t / p; else print "-"}')
      printf '%-16s %-6s %-9s %12s %12s %10s %12s\n' "$features-$hidden-$hidden-$classes" "$batch" "$r" "${t:--}" \
        "$vs1" "${p:--}" "$vsp"
    done
  done
} | tee -a "$out/host_scaling.txt"
exit $failed
