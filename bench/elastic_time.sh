#!/usr/bin/env bash
# How long a cluster of 4 multi_worker_trainer workers takes to train again after one of them is
# killed (SIGKILL), elastic against the whole restart, in one invocation:
#   elastic: troupe-launch -n 4 --elastic --min 3 --max-restarts 1: the 3 others drop it, roll back
#            to their last in-memory commit and go on; a replacement is started and joins them.
#   restart: troupe-launch -n 4 --max-restarts 1 --restart-backoff B, the trainer backing up every
#            20 steps (--checkpoint-dir): every worker is started again and resumes from the backup.
# Rank 3 is killed once the chief has computed step 50 (10 steps after the restart's backup at 40).
# "Training again" is the first step the
# chief computes after the change, read from its --record-examples file (each step's line is
# written as it computes, and carries the membership changes so far; a restarted chief writes a
# new file), polled every 10 ms. Printed per run:
#   elastic: from the kill to the first step on 3 workers, the survivors' pause as they log it,
#            the step reached and the one taken up at (the steps between run again), and to the
#            first step past the one reached; from the launcher's replacement line (and from the
#            kill) to the first step on 4 workers, and the pause the join logged;
#   restart: from the kill to the first step of the restarted cluster, the steps as above, and
#            to the first step past the one reached.
# Usage: bench/elastic_time.sh BUILD_DIR [RUNS] [BACKOFF_S]
set -u
build="$1"
runs="${2:-3}"
backoff="${3:-0.2}"
launch="$build/tools/troupe-launch"
trainer="$build/examples/multi_worker_trainer"
args=(--epochs 8 --batch 256 --step-delay-ms 20)

stamp() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
# first_line DIR PATTERN: waits (at most 120 s) for a line matching PATTERN in the chief's record
# files (DIR/worker-0-*.txt) and prints the time it was seen.
first_line() {
  for _ in $(seq 1 12000); do
    if cat "$1"/worker-0-*.txt 2>/dev/null | grep -qE "$2"; then echo "$EPOCHREALTIME"; return 0; fi
    sleep 0.01
  done
  echo "never"
  return 1
}
# kill_rank_3 DIR: kills rank 3 (SIGKILL) once the chief recorded step 50; prints the time.
kill_rank_3() {
  first_line "$1/examples" '^step=50 ' > /dev/null || return 1
  local pid
  pid=$(sed -n 's/^[0-9.]* \[rank 3\] worker 3 of 4 workers (pid \([0-9]*\)).*/\1/p' "$1/out" | head -1)
  [ -n "$pid" ] || return 1
  local at="$EPOCHREALTIME"
  kill -KILL "$pid"
  echo "$at"
}
since() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == "never") print "never"; else printf "%.2f", b - a }'; }
# last_step DIR BEFORE_CHANGES: the highest step the chief recorded with fewer changes than given.
last_before() { cat "$1"/worker-0-*.txt | awk -v c="$2" '{ split($1, s, "="); split($2, m, "="); if (m[2] < c && s[2] > x) x = s[2] } END { print x + 0 }'; }
first_with() { cat "$1"/worker-0-*.txt | awk -v c="$2" '{ split($1, s, "="); split($2, m, "="); if (m[2] >= c) { print s[2]; exit } }'; }

for run in $(seq 1 "$runs"); do
  # Elastic: the loss, then the replacement's join.
  dir="$(mktemp -d)"
  mkdir "$dir/examples"
  ( "$launch" --timeout 150 -n 4 --elastic --min 3 --max-restarts 1 -- "$trainer" --elastic "${args[@]}" \
      --record-examples "$dir/examples" 2>&1 | stamp > "$dir/out" ) &
  group=$!
  killed=$(kill_rank_3 "$dir") || { echo "run $run: elastic: could not kill rank 3"; cat "$dir/out"; exit 1; }
  resumed=$(first_line "$dir/examples" ' changes=1 ')
  reached=$(last_before "$dir/examples" 1)
  past=$(first_line "$dir/examples" "^step=$((reached + 1)) changes=[12] ")
  joined=$(first_line "$dir/examples" ' changes=2 ')
  wait "$group"
  replacement=$(awk '/starting a replacement for worker 3/ { print $1; exit }' "$dir/out")
  paused_loss=$(grep -o '^[0-9.]* \[rank 0\] troupe: warning: elastic membership: .* left; .*(paused [0-9]* ms)' "$dir/out" | grep -o 'paused [0-9]* ms' | head -1)
  paused_join=$(grep -o '^[0-9.]* \[rank 0\] troupe: warning: elastic membership: .* joined; .*(paused [0-9]* ms' "$dir/out" | grep -o 'paused [0-9]* ms' | head -1)
  echo "run $run: elastic: kill -> first step on 3 workers $(since "$killed" "$resumed") s ($paused_loss;" \
       "reached step $reached, took up at step $(first_with "$dir/examples" 1); past it $(since "$killed" "$past") s);" \
       "replacement started -> first step on 4 workers $(since "${replacement:-$killed}" "$joined") s ($paused_join)," \
       "kill -> joined $(since "$killed" "$joined") s"
  grep -o 'result: .*' "$dir/out" | head -1
  rm -rf "$dir"

  # The whole restart, beside it.
  dir="$(mktemp -d)"
  mkdir "$dir/examples"
  ( "$launch" --timeout 150 -n 4 --max-restarts 1 --restart-backoff "$backoff" -- "$trainer" "${args[@]}" \
      --checkpoint-dir "$dir/ckpt" --checkpoint-every 20 --record-examples "$dir/examples" 2>&1 | stamp > "$dir/out" ) &
  group=$!
  killed=$(kill_rank_3 "$dir") || { echo "run $run: restart: could not kill rank 3"; cat "$dir/out"; exit 1; }
  before=$(ls "$dir/examples"/worker-0-*.txt)
  restarted="never"
  for _ in $(seq 1 12000); do
    for f in "$dir/examples"/worker-0-*.txt; do
      [ "$f" = "$before" ] || { [ -s "$f" ] && restarted="$EPOCHREALTIME"; }
    done
    [ "$restarted" != "never" ] && break
    sleep 0.01
  done
  reached=$(awk '{ split($1, s, "="); if (s[2] > x) x = s[2] } END { print x + 0 }' "$before")
  past="never"
  for _ in $(seq 1 12000); do
    for f in "$dir/examples"/worker-0-*.txt; do
      [ "$f" = "$before" ] || { grep -q "^step=$((reached + 1)) " "$f" && past="$EPOCHREALTIME"; }
    done
    [ "$past" != "never" ] && break
    sleep 0.01
  done
  wait "$group"
  after=$(ls "$dir/examples"/worker-0-*.txt | grep -v "^$before$" | head -1)
  took_up=$(head -1 "$after" 2>/dev/null | sed -n 's/^step=\([0-9]*\) .*/\1/p')
  echo "run $run: restart (backoff $backoff s): kill -> first step of the restarted cluster $(since "$killed" "$restarted") s" \
       "(reached step $reached, took up at step $took_up; past it $(since "$killed" "$past") s)"
  grep -o 'result: .*' "$dir/out" | head -1
  rm -rf "$dir"
done
