#!/usr/bin/env bash
# multi_worker_trainer --checkpoint-dir on 2 workers under troupe-launch, stopped by SIGINT to the
# launcher (as Ctrl-C stops it: forwarded to every worker) in the middle of an epoch, twice, and run
# again each time, against the same run uninterrupted (16 steps an epoch, 5 epochs):
# - each stop exits 130 with both ranks stopped after the same step, inside an epoch, backed up;
# - each rerun resumes at the step after the stop;
# - a rerun with --epochs 3 after a stop in epoch 4 trains nothing, says so, prints no nan, exits 0
#   and keeps the backup;
# - the last rerun ends with steps=80 and the uninterrupted run's weights_digest on both ranks, and
#   deletes the backup.
# Every process is bounded in time and killed on exit.
# Usage: multi_worker_resume_check.sh TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
launch="$1"
trainer="$2"
. "$(dirname "$0")/multi_worker_lib.sh"

# The value of KEY= on RANK's result (or stopped) line in FILE.
rfield() { field "$1" "$2" "$3" "result|stopped"; }

args=(--epochs 5 --batch 512)  # 8192 examples: 16 steps an epoch
run_launcher "$dir/reference.out" "$launch" -n 2 --timeout 100 -- "$trainer" "${args[@]}"
[ "$rc" = 0 ] || fail "the uninterrupted run exited $rc"
expected=$(rfield 0 weights_digest "$dir/reference.out")
[ -n "$expected" ] || fail "the uninterrupted run printed no weights_digest"
[ "$(rfield 0 steps "$dir/reference.out")" = 80 ] || fail "the uninterrupted run did not run 80 steps"

backed=(--checkpoint-dir "$dir/backup" --step-delay-ms 40)

# interrupt NAME EPOCH: runs the 5 epochs from the backup, sends SIGINT to the launcher a little
# after epoch EPOCH ended, and checks the stop. Sets $stop to the step both ranks stopped after.
interrupt() {
  local name="$1" epoch="$2"
  epoch_ended() { grep -q "^\[rank 0\] Epoch $epoch/5:" "$dir/$name.out"; }
  form_s=60 start_cluster "$dir/$name.out" epoch_ended "$launch" -n 2 --timeout 100 -- "$trainer" "${args[@]}" "${backed[@]}"
  sleep 0.25  # about 6 steps of 40 ms into the next epoch of 16
  kill -INT "$launcher_pid"
  wait_launcher 60 " of SIGINT ($name)"
  [ "$rc" = 130 ] || fail "$name: the launcher exited $rc after SIGINT (expected 130)"
  stop=$(rfield 0 step "$dir/$name.out")
  [ -n "$stop" ] || fail "$name: rank 0 printed no stopped line"
  [ "$(rfield 1 step "$dir/$name.out")" = "$stop" ] || fail "$name: the ranks stopped after different steps"
  [ $((stop % 16)) != 0 ] || fail "$name: the stop at step $stop is not inside an epoch (the run went too fast)"
  [ $((stop / 16)) = "$epoch" ] || fail "$name: the stop at step $stop is not in epoch $((epoch + 1))"
  [ -f "$dir/backup/ckpt-$stop.ckpt" ] || fail "$name: no backup of step $stop: $(ls "$dir/backup")"
}

interrupt first 1
first_stop=$stop
interrupt second 3
grep -q "^\[rank 0\] resuming from ckpt-$first_stop.ckpt" "$dir/second.out" ||
  fail "the second run did not resume from ckpt-$first_stop.ckpt"
second_stop=$stop
[ "$second_stop" -gt "$first_stop" ] || fail "the second run stopped at $second_stop, before the first stop $first_stop"

# Fewer epochs than the backup has begun: nothing to train, and the backup stays.
run_launcher "$dir/fewer.out" "$launch" -n 2 --timeout 100 -- "$trainer" --epochs 3 --batch 512 "${backed[@]}"
[ "$rc" = 0 ] || fail "the --epochs 3 rerun exited $rc"
grep -q "^\[rank 0\] Nothing left to train: the run stands at step $second_stop, in epoch 4, and 3 epochs were asked for" \
  "$dir/fewer.out" || fail "the --epochs 3 rerun does not say that nothing is left to train"
grep -qi "nan" "$dir/fewer.out" && fail "the --epochs 3 rerun printed nan"
for r in 0 1; do
  [ "$(rfield $r steps "$dir/fewer.out")" = "$second_stop" ] || fail "the --epochs 3 rerun's rank $r does not stand at step $second_stop"
done
[ -f "$dir/backup/ckpt-$second_stop.ckpt" ] || fail "the --epochs 3 rerun deleted the backup: $(ls "$dir/backup")"

run_launcher "$dir/last.out" "$launch" -n 2 --timeout 100 -- "$trainer" "${args[@]}" "${backed[@]}"
[ "$rc" = 0 ] || fail "the last rerun exited $rc"
grep -q "^\[rank 0\] resuming from ckpt-$second_stop.ckpt" "$dir/last.out" ||
  fail "the last rerun did not resume from ckpt-$second_stop.ckpt"
for r in 0 1; do
  [ "$(rfield $r steps "$dir/last.out")" = 80 ] || fail "rank $r ended with steps=$(rfield $r steps "$dir/last.out") (expected 80)"
  [ "$(rfield $r weights_digest "$dir/last.out")" = "$expected" ] ||
    fail "rank $r ended with weights_digest=$(rfield $r weights_digest "$dir/last.out") (uninterrupted: $expected)"
done
ls "$dir"/backup/ckpt-*.ckpt > /dev/null 2>&1 && fail "the completed run left its backup: $(ls "$dir/backup")"
echo "PASSED stopped by SIGINT after steps $first_stop and $second_stop, a rerun with fewer epochs kept the backup, and the run ended at step 80 with the uninterrupted weights"
