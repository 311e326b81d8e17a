#!/usr/bin/env bash
# multi_worker_trainer --elastic on 4 workers under troupe-launch --elastic, two workers killed
# (SIGKILL) one after another: rank 3, then, once the others re-formed without it, rank 2.
#   twice:           --min 2: ranks 0 and 1 shrink twice (ring generations 1 and 2) and finish on 2
#                    workers, each in the process it started in, with equal weights and
#                    membership_changes=2.
#   twice-below-min: TROUPE_MIN_WORKERS=3 for the workers: the first loss shrinks to 3, the
#                    second ends ranks 0 and 1 with the fallback naming min_workers (non-zero,
#                    well before the launcher's timeout).
#   at-once:         ranks 3 and 2 killed together: both leave in one change (ring generation 1),
#                    ranks 0 and 1 finish on 2 workers with equal weights, membership_changes=1.
#   at-once-below-min: the same with TROUPE_MIN_WORKERS=3: the fallback names min_workers.
# Usage: multi_worker_elastic_twice_check.sh twice|twice-below-min|at-once|at-once-below-min TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
mode="$1" launch="$2" trainer="$3" label="$1"
. "$(dirname "$0")/multi_worker_lib.sh"

pid_of() { pids_of "$1" 4; }
every_pid() { [ -n "$(pid_of 0)" ] && [ -n "$(pid_of 1)" ] && [ -n "$(pid_of 2)" ] && [ -n "$(pid_of 3)" ]; }

# finished_on_two CHANGES LINE: the run exited 0, ranks 0 and 1 each in the process it started in,
# saying LINE (a regular expression: the last change), finished on 2 workers after CHANGES
# changes at step 168, with equal weights ($d0).
finished_on_two() {
  [ "$rc" = 0 ] || fail "the run exited $rc"
  local r
  for r in 0 1; do
    [ "$(pid_of $r | wc -l)" = 1 ] || fail "rank $r printed $(pid_of $r | wc -l) pid lines"
    grep -q "^\[rank $r\] troupe: warning: $2" "$dir/run.out" || fail "rank $r does not say: $2"
    [ "$(field $r workers)" = 2 ] || fail "rank $r finished with workers=$(field $r workers) (expected 2)"
    [ "$(field $r membership_changes)" = "$1" ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
    [ "$(field $r steps)" = 168 ] || fail "rank $r finished at step $(field $r steps) (expected 168)"
  done
  same_weights 0 1
}

# 42 steps an epoch, global batch 192 (48 rows a worker, then 64, then 96): about 9 s of training.
args=(--elastic --epochs 4 --batch 192 --step-delay-ms 50)
if [ "$mode" = twice ] || [ "$mode" = at-once ]; then
  start_cluster "$dir/run.out" every_pid "$launch" -n 4 --elastic --min 2 --timeout 100 -- "$trainer" "${args[@]}"
else
  start_cluster "$dir/run.out" every_pid env TROUPE_MIN_WORKERS=3 "$launch" -n 4 --elastic --timeout 100 -- "$trainer" "${args[@]}"
fi

pid3=$(pid_of 3)
pid2=$(pid_of 2)
[ -n "$pid3" ] && [ -n "$pid2" ] || fail "ranks 2 and 3 did not print their pids within 30 s"
sleep 2
if [ "$mode" = at-once ] || [ "$mode" = at-once-below-min ]; then
  kill -0 "$pid3" 2>/dev/null && kill -0 "$pid2" 2>/dev/null || fail "rank 2 or 3 ended before the kill"
  kill -KILL "$pid3" "$pid2"
  wait_launcher 90 " of the kills"
  grep -q "restarting" "$dir/run.out" && fail "the launcher restarted workers"
  if [ "$mode" = at-once ]; then
    finished_on_two 1 "elastic membership: $(task 2), $(task 3) left; 2 workers continue from step [0-9]* as ring generation 1 (paused [0-9]* ms)$"
    echo "PASSED (at-once): tasks 2 and 3 killed together left in one change, ranks 0 and 1 finished on 2 workers, weights $d0"
  else
    [ "$rc" != 0 ] || fail "the run exited 0 with fewer workers than min_workers"
    grep -q "^\[rank [01]\] .*elastic membership falls back to the restart path: 2 worker(s) would be left, fewer than min_workers (3); lost: $(task 2), $(task 3) " \
      "$dir/run.out" || fail "no survivor names the fallback below min_workers with tasks 2 and 3"
    grep -q "^\[rank [01]\] result:" "$dir/run.out" && fail "a rank printed a result below min_workers"
    echo "PASSED (at-once-below-min): tasks 2 and 3 killed together, the survivors fell back, named, exit $rc"
  fi
  exit 0
fi
signal_rank 3 "$pid3" KILL

# The first change completes on rank 0 before the second kill.
first="elastic membership: $(task 3) left; 3 workers continue from step [0-9]* as ring generation 1 (paused [0-9]* ms)$"
wait_for 20 grep -q "^\[rank 0\] troupe: warning: $first" "$dir/run.out" || fail "rank 0 did not re-form without task 3 within 20 s"
sleep 1
signal_rank 2 "$pid2" KILL

wait_launcher 90 " of the kills"
grep -q "restarting" "$dir/run.out" && fail "the launcher restarted workers"

for r in 0 1; do
  grep -q "^\[rank $r\] troupe: warning: $first" "$dir/run.out" || fail "rank $r does not say that task 3 left"
done
if [ "$mode" = twice ]; then
  finished_on_two 2 "elastic membership: $(task 2) left; 2 workers continue from step [0-9]* as ring generation 2 (paused [0-9]* ms)$"
  echo "PASSED (twice): tasks 3 and 2 dropped one after the other, ranks 0 and 1 finished on 2 workers, weights $d0"
else
  check_below_min 2
  echo "PASSED (twice-below-min): one loss shrank to 3 workers, the second fell back, named, exit $rc"
fi
