#!/usr/bin/env bash
# multi_worker_trainer --checkpoint-dir on 2 workers under troupe-launch --max-restarts 2, with one
# worker interrupted mid-run, against the same run uninterrupted:
#   kill: rank 1 gets SIGKILL after the first backup; the launcher names it and restarts both;
#   term: rank 1 gets SIGTERM (a preemption); both ranks save at one step, exit with status 75,
#         and are restarted.
# Either way the run completes (exit 0), resumes from a backup, and every rank's weights_digest
# equals the uninterrupted run's.
# Usage: multi_worker_trainer_restart_check.sh kill|term TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
mode="$1" launch="$2" trainer="$3" label="$1"
. "$(dirname "$0")/multi_worker_lib.sh"

args=(--epochs 3 --batch 512)  # 16 steps an epoch
run_launcher "$dir/reference.out" "$launch" -n 2 --timeout 100 -- "$trainer" "${args[@]}"
[ "$rc" = 0 ] || fail "the uninterrupted run exited $rc"
expected=$(field 0 weights_digest "$dir/reference.out")
[ -n "$expected" ] || fail "the uninterrupted run printed no weights_digest"

# has_backup: the chief's backup file is there (ckpt-<step>.ckpt; a non-chief worker's
# ckpt-<step>.worker-<rank>.tmp.ckpt comes and goes and is no backup).
has_backup() {
  ls "$dir/backup" 2>/dev/null | grep -Eq '^ckpt-[0-9]+\.ckpt$'
}

# Wait (bounded) for the first backup, then interrupt rank 1 of the first run.
start_cluster "$dir/run.out" has_backup "$launch" -n 2 --max-restarts 2 --restart-backoff 0.2 --timeout 100 -- \
  "$trainer" "${args[@]}" --checkpoint-dir "$dir/backup" --checkpoint-every 4 --step-delay-ms 25
pid=$(pids_of 1 2 | head -1)
[ -n "$pid" ] || fail "rank 1 did not print its pid"
if [ "$mode" = kill ]; then kill -KILL "$pid"; else kill -TERM "$pid"; fi

wait_launcher 90 ""
[ "$rc" = 0 ] || fail "the interrupted run exited $rc"

if [ "$mode" = kill ]; then
  grep -q "^troupe-launch: restarting all 2 workers (restart 1 of 2) in 0.2 s: worker 1 (pid $pid, .*) was killed by signal 9 (SIGKILL)$" "$dir/run.out" ||
    fail "the launcher did not restart after the SIGKILL of rank 1 (pid $pid)"
else
  grep -q "^troupe-launch: restarting all 2 workers (restart 1 of 2) in 0.2 s: worker [01] (pid [0-9]*, .*) exited with status 75 (preempted: it saved a checkpoint to restart from)$" "$dir/run.out" ||
    fail "the launcher did not restart after a preemption exit (status 75)"
  n75=$(grep -c "^troupe-launch: worker [01] (pid [0-9]*, [^)]*) exited with status 75 (preempted" "$dir/run.out")
  [ "$n75" = 2 ] || fail "$n75 workers exited with status 75 (expected both)"
  saved=()
  for r in 0 1; do
    s=$(sed -n "s/^\[rank $r\] troupe: warning: PreemptionCheckpointHandler: worker $r of 2: .* saving a checkpoint at step \([0-9]*\), then exiting with status 75$/\1/p" "$dir/run.out")
    [ -n "$s" ] || fail "rank $r did not save on preemption"
    saved+=("$s")
  done
  [ "${saved[0]}" = "${saved[1]}" ] || fail "the ranks saved at different steps: ${saved[0]} and ${saved[1]}"
  grep -q "^\[rank 1\] troupe: warning: PreemptionCheckpointHandler: worker 1 of 2: 1 worker(s) told to stop (this one by SIGTERM)" "$dir/run.out" ||
    fail "rank 1 does not say that SIGTERM told it to stop"
  grep -q "^\[rank 0\] resuming from ckpt-${saved[0]}.ckpt$" "$dir/run.out" ||
    fail "rank 0 did not resume from the preemption checkpoint ckpt-${saved[0]}.ckpt"
fi
grep -q "^\[rank 0\] resuming from ckpt-[0-9]*.ckpt$" "$dir/run.out" || fail "rank 0 did not resume from a backup"
for r in 0 1; do
  got=$(field $r weights_digest "$dir/run.out")
  [ "$got" = "$expected" ] || fail "rank $r ended with weights $got, the uninterrupted run with $expected"
done
ls "$dir"/backup/ckpt-* > /dev/null 2>&1 && fail "the backup was not deleted when the run completed"
echo "PASSED ($mode): restarted, resumed, weights $expected as without the interruption"
