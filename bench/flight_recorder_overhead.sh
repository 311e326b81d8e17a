#!/usr/bin/env bash
# The flight recorder's cost, side by side with it off (TROUPE_FLIGHT_RECORDER_ENTRIES=0) and on
# (the default 2000 entries), interleaved round by round so that a noisy neighbour hits both alike:
#  1. examples/mlp_classifier (the MLP training bench, Model::fit, REPLICAS replicas): the median
#     over rounds of each run's samples/s, and the cost 1 - on/off (the target: at most 1 %);
#  2. strategy_run_bench's BM_StrategyRunAllReduce (a step of one scalar all-reduce, the smallest
#     step that records anything): the median step time of each side.
# flight_recorder_bench measures the recording alone (BM_FlightRecord: one entry begun and ended).
#
#   bench/flight_recorder_overhead.sh [BUILD_DIR]
#   env: ROUNDS=7 EPOCHS=20 REPLICAS=2 BATCH=256 HIDDEN=128
set -euo pipefail

build_dir=${1:-build}
trainer="$build_dir/examples/mlp_classifier"
micro="$build_dir/bench/strategy_run_bench"
for b in "$trainer" "$micro"; do
  [[ -x "$b" ]] || { echo "flight_recorder_overhead.sh: no $b (cmake --build $build_dir --target mlp_classifier strategy_run_bench)" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "flight_recorder_overhead.sh: needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 2; }
rounds=${ROUNDS:-7}
epochs=${EPOCHS:-20}
replicas=${REPLICAS:-2}
batch=${BATCH:-256}
hidden=${HIDDEN:-128}

# train ENTRIES: one training run's samples/s, steps, and CPU time per step in us (rusage, startup
# included: less blurred by a loaded machine than the rate).
train() {
  local out usage
  usage=$(mktemp)
  out=$(TROUPE_FLIGHT_RECORDER_ENTRIES="$1" /usr/bin/time -o "$usage" -f "%U %S" "$trainer" --quiet \
    --replicas "$replicas" --epochs "$epochs" --batch "$batch" --hidden "$hidden" --cached-batches)
  local rate steps
  rate=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$out")
  steps=$(sed -n 's/.* steps=\([0-9]*\) .*/\1/p' <<<"$out")
  awk -v rate="$rate" -v steps="$steps" 'NF == 2 { printf "%s %s %.1f\n", rate, steps, 1e6 * ($1 + $2) / steps }' "$usage"
  rm -f "$usage"
}

# step ENTRIES REPLICAS: BM_StrategyRunAllReduce's time per step in us.
step() {
  TROUPE_FLIGHT_RECORDER_ENTRIES="$1" "$micro" --benchmark_filter="^BM_StrategyRunAllReduce/$2/" \
    --benchmark_min_time=1 --benchmark_format=csv 2>/dev/null | awk -F, '/BM_StrategyRunAllReduce/ { print $3 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "flight recorder off (TROUPE_FLIGHT_RECORDER_ENTRIES=0) and on (2000), $rounds rounds interleaved; $(nproc) cores;"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
off=(); on=(); s1_off=(); s1_on=(); s2_off=(); s2_on=()
for ((i = 0; i < rounds; ++i)); do
  off+=("$(train 0)"); on+=("$(train 2000)")
  s1_off+=("$(step 0 1)"); s1_on+=("$(step 2000 1)")
  s2_off+=("$(step 0 2)"); s2_on+=("$(step 2000 2)")
done
m_off=$(printf "%s\n" "${off[@]}" | awk '{ print $1 }' | median)
m_on=$(printf "%s\n" "${on[@]}" | awk '{ print $1 }' | median)
steps=$(printf "%s\n" "${off[@]}" | awk '{ print $2 }' | median)
printf "mlp_classifier, %s replicas, batch %s, hidden %s, %s epochs (%s steps)\n" "$replicas" "$batch" "$hidden" "$epochs" "$steps"
printf "  samples/s off %.0f, on %.0f: cost %.2f %%\n" "$m_off" "$m_on" "$(awk -v a="$m_off" -v b="$m_on" 'BEGIN { print 100 * (1 - b / a) }')"
c_off=$(printf "%s\n" "${off[@]}" | awk '{ print $3 }' | median)
c_on=$(printf "%s\n" "${on[@]}" | awk '{ print $3 }' | median)
printf "  CPU us per step off %.1f, on %.1f: cost %.2f %%\n" "$c_off" "$c_on" "$(awk -v a="$c_off" -v b="$c_on" 'BEGIN { print 100 * (b / a - 1) }')"
for r in 1 2; do
  eval "a=(\"\${s${r}_off[@]}\")"; eval "b=(\"\${s${r}_on[@]}\")"
  t_off=$(printf "%s\n" "${a[@]}" | median); t_on=$(printf "%s\n" "${b[@]}" | median)
  printf "BM_StrategyRunAllReduce/%s: off %.2f us, on %.2f us per step (%+.2f us)\n" "$r" "$t_off" "$t_on" \
    "$(awk -v a="$t_off" -v b="$t_on" 'BEGIN { print b - a }')"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
