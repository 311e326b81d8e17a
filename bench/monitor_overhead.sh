#!/usr/bin/env bash
# The metrics stream's cost to training throughput, side by side: examples/mlp_classifier with and
# without a Monitor (--dashboard-port 0: per-step timings recorded in the strategy, one event per
# step published to the metrics stream actor, the dashboard's HTTP server listening; no browser
# attached), interleaved round by round so that a noisy neighbour hits both alike. Each run
# reports the median samples/s over its epochs; the table shows the median over rounds, and the
# cost is 1 - watched/unwatched (the target: at most 2 %).
#
#   bench/monitor_overhead.sh [BUILD_DIR]
#   env: ROUNDS=7 EPOCHS=30 REPLICAS="1 2" BATCH=256 HIDDEN=128 INPUT=cached (or pipeline)
set -euo pipefail

build_dir=${1:-build}
trainer="$build_dir/examples/mlp_classifier"
[[ -x "$trainer" ]] || { echo "monitor_overhead.sh: no $trainer (cmake --build $build_dir --target mlp_classifier)" >&2; exit 2; }
rounds=${ROUNDS:-7}
epochs=${EPOCHS:-30}
replicas_list=${REPLICAS:-"1 2"}
batch=${BATCH:-256}
hidden=${HIDDEN:-128}
input=${INPUT:-cached}
input_flag=()
[[ "$input" == cached ]] && input_flag=(--cached-batches)

# run REPLICAS WATCHED: one training run, its samples/s.
run() {
  local extra=()
  [[ "$2" == 1 ]] && extra=(--dashboard-port 0)
  "$trainer" --quiet --replicas "$1" --epochs "$epochs" --batch "$batch" --hidden "$hidden" "${input_flag[@]}" \
    "${extra[@]}" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "mlp_classifier, batch $batch, hidden $hidden, $input input, $epochs epochs, $rounds rounds interleaved; $(nproc) cores"
printf "%-9s %14s %14s %8s\n" replicas "off samples/s" "on samples/s" cost
for r in $replicas_list; do
  off=(); on=()
  for ((i = 0; i < rounds; ++i)); do
    off+=("$(run "$r" 0)")
    on+=("$(run "$r" 1)")
  done
  m_off=$(printf "%s\n" "${off[@]}" | median)
  m_on=$(printf "%s\n" "${on[@]}" | median)
  printf "%-9s %14.0f %14.0f %7.2f%%\n" "$r" "$m_off" "$m_on" "$(awk -v a="$m_off" -v b="$m_on" 'BEGIN { print 100 * (1 - b / a) }')"
done
