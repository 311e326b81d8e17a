#!/usr/bin/env bash
# multi_worker_trainer --elastic on 3 workers under troupe-launch --elastic, rank 2 killed (SIGKILL)
# mid-run:
#   shrink:    --min 2: the launcher leaves ranks 0 and 1 running; they drop rank 2, roll back to
#              their last common commit and finish on 2 workers, each in the process it started
#              in, with equal weights and membership_changes=1.
#   below-min: TROUPE_MIN_WORKERS=3 for the workers: ranks 0 and 1 end with the fallback to the
#              restart path, naming min_workers and the lost worker (non-zero, well before the
#              launcher's timeout).
#   stall:     as shrink, but rank 2 is stopped (SIGSTOP) instead: the chief's heartbeat watch
#              declares it gone, the others drop it, and the launcher kills it (SIGKILL) once it
#              has been stopped past the heartbeat limit, instead of waiting for --timeout.
#   epoch-end: as shrink, with commits every 40 steps (TROUPE_COMMIT_EVERY_STEPS), rank 2 killed
#              as soon as the chief printed the end of epoch 1 (step 42): the survivors roll back
#              to the commit of the epoch's end (step 42), not to step 40 in the epoch they ended.
#   validation: as shrink, with a validation at every epoch's end (each batch held 150 ms), rank 2
#              killed as its first validation begins, when every worker agreed to end epoch 1: the
#              survivors fail inside the validation's collectives, drop rank 2, go on from the
#              commit of the epoch's end (step 42) and run the epoch's end again on 2 workers.
#   chief:     the chief (rank 0) killed instead: no change mends the loss of the chief (it holds
#              the membership), so the survivors fall back to the restart path naming it, and the
#              launcher names its death and stops the others (under --elastic it never starts the
#              whole cluster again): non-zero, no result, well before the launcher's timeout.
# Usage: multi_worker_elastic_check.sh shrink|below-min|stall|epoch-end|validation|chief TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
mode="$1" launch="$2" trainer="$3" label="$1"
. "$(dirname "$0")/multi_worker_lib.sh"

pid_of() { pids_of "$1" 3; }
every_pid() { [ -n "$(pid_of 0)" ] && [ -n "$(pid_of 1)" ] && [ -n "$(pid_of 2)" ]; }

# 42 steps an epoch, global batch 192 (64 rows a worker, then 96): about 7 s of training.
args=(--elastic --epochs 3 --batch 192 --step-delay-ms 50)
[ "$mode" = validation ] && args+=(--validation-delay-ms 150)
if [ "$mode" = epoch-end ]; then
  start_cluster "$dir/run.out" every_pid env TROUPE_COMMIT_EVERY_STEPS=40 "$launch" -n 3 --elastic --min 2 --timeout 100 -- \
    "$trainer" "${args[@]}"
elif [ "$mode" = chief ]; then
  start_cluster "$dir/run.out" every_pid "$launch" -n 3 --elastic --min 2 --timeout 100 -- "$trainer" "${args[@]}"
elif [ "$mode" != below-min ]; then
  start_cluster "$dir/run.out" every_pid "$launch" -n 3 --elastic --min 2 --timeout 100 -- "$trainer" "${args[@]}"
else
  start_cluster "$dir/run.out" every_pid env TROUPE_MIN_WORKERS=3 "$launch" -n 3 --elastic --timeout 100 -- "$trainer" "${args[@]}"
fi

# Every rank formed the cluster (it prints its pid then), and trains a while.
pid=$(pid_of 2)
[ -n "$pid" ] || fail "rank 2 did not print its pid within 30 s"
if [ "$mode" = epoch-end ]; then
  wait_for 60 grep -q "^\[rank 0\] Epoch 1/3" "$dir/run.out" || fail "the chief did not end epoch 1 within 60 s"
elif [ "$mode" = validation ]; then
  wait_for 60 grep -q "^\[rank 2\] validation 1 begins$" "$dir/run.out" || fail "rank 2 did not begin validating within 60 s"
else
  sleep 2
fi
if [ "$mode" = chief ]; then
  pid=$(pid_of 0)
  signal_rank 0 "$pid" KILL
  wait_launcher 30 " of the chief's kill"
  [ "$rc" != 0 ] || fail "the run exited 0 without its chief"
  grep -q "^troupe-launch: worker 0 (pid $pid, [^)]*) was killed by signal 9 (SIGKILL); stopping the others$" "$dir/run.out" ||
    fail "the launcher does not name the chief's death (pid $pid) and stop the others"
  grep -q "go on without it" "$dir/run.out" && fail "the launcher went on without the chief"
  # Both survivors find it; the first to exit may make the launcher stop the other before it says so.
  named=$(grep -c "^\[rank [12]\] .*elastic membership falls back to the restart path: the chief $(task 0) was lost " "$dir/run.out")
  [ "$named" -ge 1 ] || fail "no survivor names the fallback for the lost chief"
  grep -q "^\[rank [012]\] result:" "$dir/run.out" && fail "a rank printed a result without its chief"
  echo "PASSED (chief): the survivors fell back naming the lost chief ($named of 2), the launcher stopped them, exit $rc"
  exit 0
fi
if [ "$mode" = stall ]; then signal_rank 2 "$pid" STOP; else signal_rank 2 "$pid" KILL; fi

wait_launcher 90 " of the kill"

grep -q "^troupe-launch: worker 2 (pid $pid, [^)]*) was killed by signal 9 (SIGKILL); --elastic: the 2 others go on without it$" \
  "$dir/run.out" || fail "the launcher did not leave the others running after the SIGKILL of rank 2 (pid $pid)"
grep -q "restarting" "$dir/run.out" && fail "the launcher restarted workers"

if [ "$mode" = stall ]; then
  grep -q "^troupe-launch: worker 2 (pid $pid, [^)]*) has been stopped for [0-9.]* s, past the heartbeat limit (TROUPE_HEARTBEAT_MS x (TROUPE_MISSED_HEARTBEATS + 1)); --elastic: killing it (SIGKILL) as lost$" \
    "$dir/run.out" || fail "the launcher did not kill the stopped rank 2 (pid $pid) as lost"
fi
if [ "$mode" != below-min ]; then
  [ "$rc" = 0 ] || fail "the run exited $rc"
  for r in 0 1; do
    # One pid line each: the survivors were never started again.
    [ "$(pid_of $r | wc -l)" = 1 ] || fail "rank $r printed $(pid_of $r | wc -l) pid lines"
    grep -q "^\[rank $r\] troupe: warning: elastic membership: /job:worker/replica:0/task:2 left; 2 workers continue from step [0-9]* as ring generation 1 (paused [0-9]* ms)$" \
      "$dir/run.out" || fail "rank $r does not say that task 2 left"
    [ "$(field $r workers)" = 2 ] || fail "rank $r finished with workers=$(field $r workers) (expected 2)"
    [ "$(field $r membership_changes)" = 1 ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
    [ "$(field $r steps)" = 126 ] || fail "rank $r finished at step $(field $r steps) (expected 126)"
    if [ "$mode" = epoch-end ] || [ "$mode" = validation ]; then
      from=$(sed -n "s/^\[rank $r\] troupe: warning: elastic membership: .* left; 2 workers continue from step \([0-9]*\) .*/\1/p" "$dir/run.out")
      [ "$from" = 42 ] || fail "rank $r went on from step $from after a loss at epoch 1's end (expected 42, the epoch's end)"
    fi
    if [ "$mode" = validation ]; then
      grep -q "^\[rank $r\] troupe: warning: elastic membership: the end of epoch 1 (validation, callbacks, backup) runs again on the 2 workers that continue$" \
        "$dir/run.out" || fail "rank $r does not say that the end of epoch 1 runs again"
      # Validations 1 (cut short), 1 again, 2 and 3.
      [ "$(grep -c "^\[rank $r\] validation [0-9]* begins$" "$dir/run.out")" = 4 ] ||
        fail "rank $r began $(grep -c "^\[rank $r\] validation [0-9]* begins$" "$dir/run.out") validations (expected 4)"
    fi
  done
  same_weights 0 1
  acc=$(field 0 accuracy)
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "accuracy $acc after the change (expected >= 0.9)"
  echo "PASSED ($mode): task 2 dropped, ranks 0 and 1 finished in their own processes on 2 workers, weights $d0"
else
  check_below_min 2
  echo "PASSED (below-min): the survivors fell back to the restart path ($named of 2 named it before the launcher stopped them), exit $rc"
fi
