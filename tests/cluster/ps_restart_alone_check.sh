#!/usr/bin/env bash
# A ps task SIGKILLed mid-fit under troupe-launch --max-restarts 1 --ps 1 is restarted alone:
#   resume    the launcher restarts the ps task alone on its address; the chief and both workers
#             keep their processes; fit restores every shard from the last sharded checkpoint (it
#             says the step) and finishes: exit 0, ps_restarts=1, step=400, and its last loss is
#             close to an uninterrupted run's of the same flags (run first);
#   budget    the restarted ps task killed again, past --max-restarts 1: the launcher gives up,
#             naming the ps task killed by signal 9, with its status (137);
#   stranger  while the lost ps task is down (--restart-backoff 4), a process of the same program
#             without the cluster's token listens on its address: the chief does not take it (no
#             "reached ... again" while it listens); once it is gone, the real ps task restarts and
#             training finishes as in resume.
# Usage: ps_restart_alone_check.sh resume|budget|stranger TROUPE_LAUNCH PS_TRAINER
set -u
mode="$1"
launch="$2"
trainer="$3"
. "$(dirname "$0")/../programs/multi_worker_lib.sh"
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
flags=(--closures 400 --step-delay-ms 20 --checkpoint-dir "$dir/ckpt" --checkpoint-every 20)

# This run's task of TF_CONFIG type $1 (pids of every one, one a line).
tasks() {
  for p in $(pgrep -f -- "--checkpoint-dir $dir/ckpt"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -q "^TF_CONFIG=.*\"type\": *\"$1\""; then echo "$p"; fi
  done
}
whole() { ls -d "$dir"/ckpt/ckpt-* 2>/dev/null | grep -cv '\.tmp-'; }
two_checkpoints() { [ "$(whole)" -ge 2 ]; }
wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
  local seconds="$1" what="$2"
  shift 2
  for _ in $(seq 1 $((seconds * 10))); do
    "$@" && return 0
    kill -0 "$launcher_pid" 2>/dev/null || fail "the launcher ended before $what"
    sleep 0.1
  done
  fail "not $what within $seconds s"
}
resumed() { grep -q "training resumes at step" "$dir/run.out"; }

if [ "$mode" = resume ]; then
  # The uninterrupted run of the same flags, for its last loss.
  run_launcher "$dir/plain.out" timeout 120 "$launch" --timeout 100 --ps 1 -n 2 --chief -- "$trainer" "${flags[@]}"
  [ "$rc" = 0 ] || fail "the uninterrupted run exited $rc"
  plain_loss=$(field "$(grep "^\[rank 0\] result: " "$dir/plain.out")" loss_last)
  rm -rf "$dir/ckpt"
fi

backoff=0.5
[ "$mode" = stranger ] && backoff=4
# Two checkpoints (one is whole however the kill lands), then the ps task is killed. A port that
# stayed taken at the start (the launcher ends with 98) starts the run again (start_cluster).
form_s=60 start_cluster "$dir/run.out" two_checkpoints timeout 170 "$launch" --timeout 150 --max-restarts 1 \
  --restart-backoff "$backoff" --ps 1 -n 2 --chief -- "$trainer" "${flags[@]}"
ps_pid=$(tasks ps)
chief=$(tasks chief)
workers=$(tasks worker | sort | tr '\n' ' ')
[ -n "$ps_pid" ] && [ -n "$chief" ] && [ "$(echo $workers | wc -w)" = 2 ] || fail "did not find this run's tasks"
ps_config=$(tr '\0' '\n' < "/proc/$ps_pid/environ" | sed -n 's/^TF_CONFIG=//p')
kill -KILL "$ps_pid"

if [ "$mode" = stranger ]; then
  # The same program as the ps task, on its address, without the cluster's token.
  env -u TROUPE_CLUSTER_TOKEN TF_CONFIG="$ps_config" "$trainer" "${flags[@]}" > "$dir/stranger.out" 2>&1 &
  stranger=$!
  track "$stranger"
  sleep 2.5
  kill -0 "$stranger" 2>/dev/null || fail "the stranger did not stay up"
  grep -q "reached /job:ps/replica:0/task:0 again" "$dir/run.out" && fail "the chief took the stranger for the ps task"
  resumed && fail "training resumed while only the stranger listened"
  kill -KILL "$stranger"
  wait "$stranger" 2>/dev/null
  untrack "$stranger"
fi

wait_until 60 "training resumed after the ps task's restart" resumed
for p in $chief $workers; do
  kill -0 "$p" 2>/dev/null || fail "task $p (chief or worker) did not keep running"
done
new_ps=$(tasks ps)
[ -n "$new_ps" ] && [ "$new_ps" != "$ps_pid" ] || fail "no new ps task (before: $ps_pid, now: $new_ps)"
grep -q "^troupe-launch: worker 3 (pid $ps_pid, .*) was killed by signal 9 (SIGKILL); restarting it alone on .* (restart 1 of 1)" "$dir/run.out" ||
  fail "the launcher did not say it restarts the ps task alone"

if [ "$mode" = budget ]; then
  kill -KILL "$new_ps"
  wait_launcher 150 ""
  [ "$rc" = 137 ] || fail "the launcher exited $rc (expected 137, the ps task's SIGKILL)"
  grep -q "^troupe-launch: giving up after 1 restart; the last failure: worker 3 (pid $new_ps, .*) was killed by signal 9" "$dir/run.out" ||
    fail "the launcher did not give up naming the ps task killed past the budget"
  echo PASSED
  exit 0
fi

wait_launcher 150 ""
[ "$rc" = 0 ] || fail "the launcher exited $rc (expected 0 after the ps task's restart)"
grep -q "^troupe-launch: restarting all" "$dir/run.out" && fail "the launcher restarted the whole cluster"
line=$(grep "^\[rank 0\] result: " "$dir/run.out" | tail -n 1)
[ -n "$line" ] || fail "no result line"
echo "$line"
[ "$(grep -c "^\[rank 0\] result: " "$dir/run.out")" = 1 ] || fail "more than one chief ran"
restarts=$(field "$line" ps_restarts); start=$(field "$line" start_step); step=$(field "$line" step)
[ "$restarts" = 1 ] || fail "ps_restarts=$restarts (expected 1)"
[ "$start" = 0 ] || fail "start_step=$start (expected 0: the chief never restarted)"
[ "$step" = 400 ] || fail "step=$step (expected 400)"
at=$(sed -n 's/.*training resumes at step \([0-9]*\) .*/\1/p' "$dir/run.out" | head -n 1)
[ -n "$at" ] && [ "$at" -ge 20 ] && [ "$at" -lt 400 ] || fail "resumed at step '$at' (expected a checkpoint's step, 20..399)"
grep -q "saved .* to $dir/ckpt/ckpt-$at\.tmp-" "$dir/run.out" || fail "no checkpoint was saved at step $at"
if [ "$mode" = resume ]; then
  last=$(field "$line" loss_last)
  echo "last loss $last; the uninterrupted run's $plain_loss"
  # Asynchronous updates differ from run to run; a restart from the checkpoint ends near the same
  # loss, far below the untrained one (about 1.4 for 4 classes).
  awk -v a="$last" -v b="$plain_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && b > 0 && d <= 0.1 + 0.5 * b) }' ||
    fail "the last loss $last is not close to the uninterrupted run's $plain_loss"
fi
echo PASSED
