#!/usr/bin/env bash
# The dashboard's cost to throughput under MultiWorkerMirroredStrategy, side by side: 2 workers of
# examples/multi_worker_trainer (troupe-launch -n 2, loopback) with and without --dashboard-port 0
# (the monitor on both workers, the chief serving the dashboard, no browser open), interleaved
# round by round so that a noisy neighbour hits both alike.
#
# Columns: a run's throughput is the median samples/s of the chief's epoch lines (the first left
# out), and its 90th percentile (p90: the epochs least disturbed by other processes, which on a
# loaded machine shows an intrinsic cost more steadily than the median); each column is the median
# over rounds. cost = 1 - on/off (the target: at most 2 %). The
# load-independent columns come from the rusage of both workers (startup included): CPU time per
# step, and voluntary (a thread went to sleep) and involuntary (preempted) context switches per
# step. Spinning waits fill idle cores, so CPU per step moves little with a latency cost; count the
# switches, and PROFILE=1 for the monitor's own CPU.
#
# PROFILE=1 adds one watched run under `perf record` (when perf is installed): the CPU time of the
# monitor's own threads (troupe-metrics: the stream, troupe-http: the dashboard) and of the
# monitor's code on the training threads, per step, and their context switches per step.
#
# Pass a second build's trainer to compare two versions in the same rounds.
#
#   bench/monitor_mw_overhead.sh [BUILD_DIR] [OTHER_TRAINER LABEL]
#   env: ROUNDS=11 EPOCHS=150 BATCH=256 PROFILE=0
set -euo pipefail

build_dir=${1:-build}
launch="$build_dir/tools/troupe-launch"
trainers=("$build_dir/examples/multi_worker_trainer")
labels=("this build")
if [[ $# -ge 3 ]]; then trainers+=("$2"); labels+=("$3"); fi
for t in "$launch" "${trainers[@]}"; do
  [[ -x "$t" ]] || { echo "monitor_mw_overhead.sh: no $t (cmake --build $build_dir --target multi_worker_trainer troupe-launch)" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "monitor_mw_overhead.sh: needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 2; }
rounds=${ROUNDS:-11}
epochs=${EPOCHS:-150}
batch=${BATCH:-256}
steps=$((epochs * (8192 / batch)))

# run TRAINER WATCHED: one 2-worker run; prints the median of the chief's samples/s over its
# epochs (the first left out), then per step: CPU us, voluntary and involuntary switches.
run() {
  local extra=() out usage
  [[ "$2" == 1 ]] && extra=(--dashboard-port 0)
  usage=$(mktemp)
  out=$(/usr/bin/time -o "$usage" -f "%U %S %w %c" "$launch" -n 2 --timeout 300 -- "$1" --epochs "$epochs" \
    --batch "$batch" "${extra[@]}" 2>&1)
  local rates rate p90
  rates=$(sed -n 's/^\[rank 0\] Epoch .* \([0-9.]*\) samples\/s.*/\1/p' <<<"$out" | tail -n +2)
  rate=$(median <<<"$rates")
  p90=$(sort -g <<<"$rates" | awk '{ v[NR] = $1 } END { i = int(0.9 * NR); if (i < 1) i = 1; print v[i] }')
  awk -v rate="$rate" -v p90="$p90" -v steps="$steps" 'NF == 4 { printf "%s %s %.1f %.2f %.2f\n", rate, p90, 1e6 * ($1 + $2) / steps, $3 / steps, $4 / steps }' "$usage"
  rm -f "$usage"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
med() { printf "%s\n" $1 | median; }

echo "multi_worker_trainer on 2 workers (loopback), global batch $batch, $epochs epochs ($steps steps) per run,"
echo "$rounds rounds interleaved; $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rate best cpu vol inv
for ((i = 0; i < rounds; ++i)); do
  for t in "${!trainers[@]}"; do
    for w in 0 1; do
      read -r r b c v n <<<"$(run "${trainers[$t]}" "$w")"
      rate[$t.$w]+="$r "; best[$t.$w]+="$b "; cpu[$t.$w]+="$c "; vol[$t.$w]+="$v "; inv[$t.$w]+="$n "
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-12s %-4s %11s %8s %11s %8s %12s %14s %16s\n" trainer dash samples/s cost "p90 epoch" cost \
  "CPU us/step" "voluntary/step" "involuntary/step"
cost() { [[ $1 == 1 ]] && awk -v a="$2" -v b="$3" 'BEGIN { printf "%.2f%%", 100 * (1 - b / a) }' || echo ""; }
for t in "${!trainers[@]}"; do
  off=$(med "${rate[$t.0]}")
  off_best=$(med "${best[$t.0]}")
  for w in 0 1; do
    m=$(med "${rate[$t.$w]}")
    b=$(med "${best[$t.$w]}")
    printf "%-12s %-4s %11.0f %8s %11.0f %8s %12.0f %14.1f %16.1f\n" "${labels[$t]}" "$([[ $w == 1 ]] && echo on || echo off)" \
      "$m" "$(cost "$w" "$off" "$m")" "$b" "$(cost "$w" "$off_best" "$b")" "$(med "${cpu[$t.$w]}")" \
      "$(med "${vol[$t.$w]}")" "$(med "${inv[$t.$w]}")"
  done
done
for t in "${!trainers[@]}"; do
  echo "${labels[$t]} samples/s, off: ${rate[$t.0]}"
  echo "${labels[$t]} samples/s, on:  ${rate[$t.1]}"
done

if [[ "${PROFILE:-0}" == 1 ]]; then
  command -v perf >/dev/null || { echo "PROFILE=1: perf is not installed (apt-get install linux-perf)"; exit 0; }
  data=$(mktemp)
  perf record -q -o "$data" -e cpu-clock/freq=10000/ -e sched:sched_switch -- "$launch" -n 2 --timeout 300 -- \
    "${trainers[0]}" --epochs "$epochs" --batch "$batch" --dashboard-port 0 >/dev/null 2>&1
  # Samples at 10 kHz are 100 us each. The monitor's code: the stream and its ring, the Monitor
  # and its fit callback, and the dashboard's server.
  perf script -i "$data" -F comm,event,ip,sym 2>/dev/null | awk -v steps="$steps" '
    /cpu-clock/ {
      all++
      if ($1 ~ /^troupe-(metrics|http)$/) threads++
      else if ($0 ~ /troupe::(Monitor|actors::(step_ring|metrics_stream|metrics_history)|detail::HttpServer)/) code++
    }
    /sched_switch/ { sw++; if ($1 ~ /^troupe-(metrics|http)$/) msw++ }
    END {
      printf "profile of one watched run (%s): CPU us/step: all threads %.0f, the monitor'"'"'s threads %.2f, the monitor'"'"'s code on other threads %.2f\n", "this build", all * 100 / steps, threads * 100 / steps, code * 100 / steps
      printf "context switches/step: all threads %.1f, the monitor'"'"'s threads %.3f\n", sw / steps, msw / steps
    }'
  rm -f "$data"
fi
