#!/usr/bin/env bash
# A ps task SIGKILLed mid-fit under troupe-launch --max-restarts 1 with TROUPE_PS_RESTART_WAIT_S=0
# (the chief does not wait for a ps task restarted alone, so the launcher restarts the whole
# cluster, the path a ps task that does not come back falls back to): ps_trainer (fit, Adam) saves
# a sharded checkpoint every 20 steps; the chief fails naming the lost ps task, the launcher
# restarts the cluster, and the new chief resumes from the last checkpoint. Checked: the launcher exits 0;
# the second run's result line says ps_restarts=1, a start_step at which the first run saved a
# checkpoint (at least 20: fit saves once the closures in flight are done, a few steps after the
# 20 asked), step=400 (every step of the run done, none
# twice: 400 - start_step steps in the second run), and its first losses are below half the
# first run's (it went on from trained weights rather than from the start).
# Usage: ps_resume_check.sh TROUPE_LAUNCH PS_TRAINER
set -u
launch="$1"
trainer="$2"
. "$(dirname "$0")/../programs/multi_worker_lib.sh"
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# Wait for a second checkpoint (so one is whole however the kill lands), then kill the ps task.
# A port that stayed taken (the launcher ends with 98) starts the run again (start_cluster).
whole() { ls -d "$dir"/ckpt/ckpt-* 2>/dev/null | grep -cv '\.tmp-'; }
two_checkpoints() { [ "$(whole)" -ge 2 ]; }
form_s=60 start_cluster "$dir/run.out" two_checkpoints env TROUPE_PS_RESTART_WAIT_S=0 timeout 170 "$launch" --timeout 150 \
  --max-restarts 1 --restart-backoff 0.2 --ps 1 -n 2 --chief -- "$trainer" \
  --closures 400 --step-delay-ms 20 --checkpoint-dir "$dir/ckpt" --checkpoint-every 20
# This run's tasks are the processes whose command line names its checkpoint directory.
ps_pid=""
for p in $(pgrep -f -- "--checkpoint-dir $dir/ckpt"); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -q '^TF_CONFIG=.*"type": *"ps"'; then ps_pid=$p; fi
done
[ -n "$ps_pid" ] || fail "found no ps task of this run"
kill -KILL "$ps_pid"

wait_launcher 150 ""
[ "$rc" = 0 ] || fail "the launcher exited $rc (expected 0 after one restart)"
grep -q "^troupe-launch: restarting all 4 workers (restart 1 of 1) .*killed by signal 9" "$dir/run.out" ||
  fail "the launcher did not restart the cluster after the ps task was killed"
first=$(grep "^\[rank 0\] closures [0-9]*/400 done" "$dir/run.out" | head -n 1)
line=$(grep "^\[rank 0\] result: " "$dir/run.out" | tail -n 1)
[ -n "$line" ] || fail "no result line"
echo "$line"
restarts=$(field "$line" ps_restarts); start=$(field "$line" start_step); step=$(field "$line" step)
[ "$restarts" = 1 ] || fail "ps_restarts=$restarts (expected 1)"
[ "$step" = 400 ] || fail "step=$step (expected 400)"
[ "$start" -ge 20 ] && [ "$start" -lt 400 ] || fail "start_step=$start (expected a checkpoint's step, 20..399)"
[ -n "$(grep "saved .* to $dir/ckpt/ckpt-$start\.tmp-" "$dir/run.out")" ] || fail "no checkpoint was saved at step $start"
grep -q "^\[rank 0\] ps_trainer: resumed at step $start" "$dir/run.out" || fail "the second chief did not say it resumed"
# The first run's first 10 closures' loss (its first progress line) against the resumed run's
# first 10: a run that started again from fresh weights would begin where the first one began.
first_loss=$(echo "$first" | sed -n 's/.* done, loss \([0-9.e+-]*\),.*/\1/p')
resumed_loss=$(field "$line" loss_first)
echo "first run's first loss $first_loss; resumed run's first loss $resumed_loss"
awk -v f="$first_loss" -v l="$resumed_loss" 'BEGIN { exit !(f > 0 && l > 0 && l < f / 2) }' ||
  fail "the resumed run's first loss $resumed_loss is not below half the first run's $first_loss"
echo PASSED
