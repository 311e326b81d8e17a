#!/usr/bin/env bash
# Where the TCP ring's bandwidth goes at 4-8 processes: tcp_allreduce_bench over every combination
# of segment size, send-ahead (tcp_ring_options::send_ahead) and spin, rounds interleaved so that
# the machine's drift hits every setting alike. Beside it, the same sizes over PyTorch's Gloo when
# PyTorch is there (bench/torch_gloo_allreduce.py). Made for a host with a core per rank.
#
# Prints one table (median over rounds of the slowest rank's median; busbw in GB/s; the ratio to
# the default setting, > 1 faster) and writes it to OUT/ring_sweep.txt, every run under OUT/runs/.
# Exits 1 when a run fails.
#
#   bench/ring_sweep.sh BIN_DIR [OUT]    BIN_DIR: a pack's bin/ (tools/pack-gpu.sh; its ../lib is
#                                        used) or a build tree's bench/
#   env: NPROCS="4 8" SIZES="16777216 67108864" SEGMENTS="262144 1048576 4194304"
#        AHEAD="on off" SPINS="50 0" REPS=3 ROUNDS=2 PYTHON=python3
set -uo pipefail

[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: bench/ring_sweep.sh BIN_DIR [OUT]" >&2; exit 2; }
bin=$(cd "$1" && pwd) || exit 2
out=${2:-./ring-sweep}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
nprocs=${NPROCS:-"4 8"}
sizes=${SIZES:-"16777216 67108864"}
segments=${SEGMENTS:-"262144 1048576 4194304"}
aheads=${AHEAD:-"on off"}
spins=${SPINS:-"50 0"}
reps=${REPS:-3}
rounds=${ROUNDS:-2}
ring=$bin/tcp_allreduce_bench
[[ -x $ring ]] || { echo "ring_sweep: no tcp_allreduce_bench in $bin" >&2; exit 2; }
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH=$(cd "$bin/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out/runs" || exit 2
have_torch=1
"$python" -c "import torch, torch.distributed" 2>/dev/null || have_torch=0

failed=0
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
value() {  # value FILE PREFIX BYTES FIELD
  awk -v p="$2" -v b="bytes=$3" -v f="$4=" '$1 == p && $2 == b {
    for (i = 1; i <= NF; ++i) if (index($i, f) == 1) print substr($i, length(f) + 1) }' "$1"
}
declare -A times
settings=()
for seg in $segments; do for ahead in $aheads; do for spin in $spins; do settings+=("$seg:$ahead:$spin"); done; done; done
echo "machine: $(nproc) CPUs, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')" | tee "$out/ring_sweep.txt"
for ((round = 1; round <= rounds; ++round)); do
  for n in $nprocs; do
    for setting in "${settings[@]}"; do
      IFS=: read -r seg ahead spin <<<"$setting"
      log=$out/runs/troupe-$n-$seg-$ahead-$spin-$round.txt
      # shellcheck disable=SC2086  # the list of sizes
      if ! "$ring" -n "$n" --reps "$reps" --target-ms 30 --segment-bytes "$seg" --send-ahead "$ahead" \
          --spin-us "$spin" $sizes >"$log" 2>&1; then
        echo "ring_sweep: failed: n=$n $setting (see $log)" >&2
        failed=1
      fi
      for s in $sizes; do times[$n:$s:$setting]+="$(value "$log" tcp_allreduce "$s" median_us) "; done
    done
    if [[ $have_torch == 1 ]]; then
      log=$out/runs/gloo-$n-$round.txt
      # shellcheck disable=SC2086
      "$python" "$here/torch_gloo_allreduce.py" -n "$n" --reps "$reps" --target-ms 30 $sizes >"$log" 2>&1 || {
        echo "ring_sweep: failed: gloo n=$n (see $log)" >&2
        failed=1
      }
      for s in $sizes; do times[$n:$s:gloo]+="$(value "$log" gloo_allreduce "$s" median_us) "; done
    fi
  done
done
{
  echo
  echo "time per all-reduce (us), median over $rounds rounds; busbw GB/s; vs default = default's time / this"
  printf '%-6s %-10s %-24s %12s %8s %11s\n' ranks bytes "segment:ahead:spin" time_us busbw "vs default"
  for n in $nprocs; do
    for s in $sizes; do
      # shellcheck disable=SC2086
      base=$(median ${times[$n:$s:1048576:on:50]:-})
      for setting in "${settings[@]}" $([[ $have_torch == 1 ]] && echo gloo); do
        # shellcheck disable=SC2086
        t=$(median ${times[$n:$s:$setting]:-})
        [[ -n $t ]] || continue
        awk -v n="$n" -v s="$s" -v name="$setting" -v t="$t" -v b="$base" 'BEGIN {
          bus = s / (t / 1e6) / 1e9 * 2 * (n - 1) / n
          printf "%-6s %-10s %-24s %12.1f %8.2f %11s\n", n, s, name, t, bus, b == "" ? "-" : sprintf("%.2fx", b / t) }'
      done
    done
  done
} | tee -a "$out/ring_sweep.txt"
exit $failed
