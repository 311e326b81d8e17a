#!/usr/bin/env bash
# The dashboard's cost to throughput under MultiWorkerMirroredStrategy, side by side: 2 workers of
# examples/multi_worker_trainer (troupe-launch -n 2, loopback) with and without --dashboard-port 0,
# interleaved round by round so that a noisy neighbour hits both alike. A run's throughput is the
# median samples/s of the chief's epoch lines; the table shows the median over rounds, the cost
# 1 - watched/unwatched (the target: at most 2 %), and the CPU time both workers spent per step. Pass a second build's trainer to
# compare two versions in the same rounds.
#
#   bench/monitor_mw_overhead.sh [BUILD_DIR] [OTHER_TRAINER LABEL]
#   env: ROUNDS=5 EPOCHS=60 BATCH=256
set -euo pipefail

build_dir=${1:-build}
launch="$build_dir/tools/troupe-launch"
trainers=("$build_dir/examples/multi_worker_trainer")
labels=("this build")
if [[ $# -ge 3 ]]; then trainers+=("$2"); labels+=("$3"); fi
for t in "$launch" "${trainers[@]}"; do
  [[ -x "$t" ]] || { echo "monitor_mw_overhead.sh: no $t (cmake --build $build_dir --target multi_worker_trainer troupe-launch)" >&2; exit 2; }
done
rounds=${ROUNDS:-5}
epochs=${EPOCHS:-60}
batch=${BATCH:-256}

# run TRAINER WATCHED: one 2-worker run; prints the median of the chief's samples/s over its
# epochs (the first left out) and the CPU time of both workers per step in us.
run() {
  local extra=() out
  [[ "$2" == 1 ]] && extra=(--dashboard-port 0)
  out=$(TIMEFORMAT='cpu %U %S'; { time "$launch" -n 2 --timeout 300 -- "$1" --epochs "$epochs" --batch "$batch" \
    "${extra[@]}" 2>&1; } 2>&1)
  local rate cpu
  rate=$(sed -n 's/^\[rank 0\] Epoch .* \([0-9.]*\) samples\/s.*/\1/p' <<<"$out" | tail -n +2 | median)
  cpu=$(awk -v steps=$((epochs * 8192 / batch)) '/^cpu / { print 1e6 * ($2 + $3) / steps }' <<<"$out")
  echo "$rate $cpu"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "multi_worker_trainer on 2 workers (loopback), global batch $batch, $epochs epochs, $rounds rounds interleaved; $(nproc) cores"
printf "%-12s %14s %14s %8s %16s %16s\n" trainer "off samples/s" "on samples/s" cost "off CPU us/step" "on CPU us/step"
declare -A off on off_cpu on_cpu
for ((i = 0; i < rounds; ++i)); do
  for t in "${!trainers[@]}"; do
    read -r rate cpu <<<"$(run "${trainers[$t]}" 0)"
    off[$t]+="$rate "; off_cpu[$t]+="$cpu "
    read -r rate cpu <<<"$(run "${trainers[$t]}" 1)"
    on[$t]+="$rate "; on_cpu[$t]+="$cpu "
  done
done
for t in "${!trainers[@]}"; do
  m_off=$(printf "%s\n" ${off[$t]} | median)
  m_on=$(printf "%s\n" ${on[$t]} | median)
  printf "%-12s %14.0f %14.0f %7.2f%% %16.0f %16.0f\n" "${labels[$t]}" "$m_off" "$m_on" \
    "$(awk -v a="$m_off" -v b="$m_on" 'BEGIN { print 100 * (1 - b / a) }')" \
    "$(printf "%s\n" ${off_cpu[$t]} | median)" "$(printf "%s\n" ${on_cpu[$t]} | median)"
done
