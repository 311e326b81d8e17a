#!/usr/bin/env bash
# The metrics stream's cost to training throughput, side by side: examples/mlp_classifier with and
# without a Monitor (--dashboard-port 0: per-step timings recorded in the strategy, one event per
# step copied into the metrics stream's ring, the dashboard's HTTP server listening; no browser
# attached), interleaved round by round so that a noisy neighbour hits both alike. Each run
# reports the median samples/s over its epochs; the table shows the median over rounds, and the
# cost is 1 - watched/unwatched (the target: at most 2 %). The load-independent columns, from the
# process's rusage (startup included): CPU time per step, and voluntary and involuntary context
# switches per step.
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

# run REPLICAS WATCHED: one training run: its samples/s, then per step CPU us, voluntary and
# involuntary context switches.
run() {
  local extra=() usage out
  [[ "$2" == 1 ]] && extra=(--dashboard-port 0)
  usage=$(mktemp)
  out=$(/usr/bin/time -o "$usage" -f "%U %S %w %c" "$trainer" --quiet --replicas "$1" --epochs "$epochs" --batch "$batch" \
    --hidden "$hidden" "${input_flag[@]}" "${extra[@]}")
  local rate steps
  rate=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$out")
  steps=$(sed -n 's/.* steps=\([0-9]*\) .*/\1/p' <<<"$out")
  awk -v rate="$rate" -v steps="$steps" 'NF == 4 { printf "%s %.1f %.2f %.2f\n", rate, 1e6 * ($1 + $2) / steps, $3 / steps, $4 / steps }' "$usage"
  rm -f "$usage"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

[[ -x /usr/bin/time ]] || { echo "monitor_overhead.sh: needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 2; }
col() { awk -v c="$1" '{ print $c }' | median; }
echo "mlp_classifier, batch $batch, hidden $hidden, $input input, $epochs epochs, $rounds rounds interleaved; $(nproc) cores;"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-9s %14s %14s %8s %16s %16s\n" replicas "off samples/s" "on samples/s" cost "CPU us/step" "switches/step"
printf "%-9s %14s %14s %8s %16s %16s\n" "" "" "" "" "off / on" "vol+invol off / on"
for r in $replicas_list; do
  off=(); on=()
  for ((i = 0; i < rounds; ++i)); do
    off+=("$(run "$r" 0)")
    on+=("$(run "$r" 1)")
  done
  m_off=$(printf "%s\n" "${off[@]}" | col 1)
  m_on=$(printf "%s\n" "${on[@]}" | col 1)
  sw_off=$(printf "%s\n" "${off[@]}" | awk '{ print $3 + $4 }' | median)
  sw_on=$(printf "%s\n" "${on[@]}" | awk '{ print $3 + $4 }' | median)
  printf "%-9s %14.0f %14.0f %7.2f%% %16s %16s\n" "$r" "$m_off" "$m_on" \
    "$(awk -v a="$m_off" -v b="$m_on" 'BEGIN { print 100 * (1 - b / a) }')" \
    "$(printf "%.0f / %.0f" "$(printf "%s\n" "${off[@]}" | col 2)" "$(printf "%s\n" "${on[@]}" | col 2)")" \
    "$(printf "%.1f / %.1f" "$sw_off" "$sw_on")"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
