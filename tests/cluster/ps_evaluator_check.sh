#!/usr/bin/env bash
# The sidecar evaluator beside a training: ps_trainer --mode evaluator watches the checkpoint
# directory while ps_trainer fit (1 ps task, 2 workers, under troupe-launch) saves a sharded
# checkpoint every 40 steps and at step 200. Checked: both exit 0; the evaluator evaluated every
# checkpoint the chief saved, each once, in step order, the last at step 200 (--final-step, where
# it stops by itself); its eval_loss fell from the first checkpoint to the last, to less than half;
# its TensorBoard event file holds eval_loss and eval_accuracy.
# The training runs Adam at --lr 0.001 (a tenth of ps_trainer's default): at 0.01 the model has
# converged by the first checkpoint (eval_loss about 0.2 at step 40, 0.14-0.17 after), so
# first-against-last compared two points of a plateau whose asynchronous noise (the order in which
# the workers' updates land, which load changes) is as large as what is left to fall. At 0.001 the
# eval_loss is still falling steadily over the 200 steps (about 0.67 at step 40, 0.17 at step 200),
# so a correct run falls by far more than that noise, and an evaluator that restored the wrong
# weights (or none) does not.
# Usage: ps_evaluator_check.sh TROUPE_LAUNCH PS_TRAINER
set -u
launch="$1"
trainer="$2"
dir="$(mktemp -d)"
evaluator=""
cleanup() {
  [ -n "$evaluator" ] && kill -KILL "$evaluator" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; cat "$dir/train" "$dir/eval"; exit 1; }

timeout 150 "$trainer" --mode evaluator --checkpoint-dir "$dir/ckpt" --tensorboard-dir "$dir/logs" --final-step 200 \
  > "$dir/eval" 2>&1 &
evaluator=$!
timeout 150 "$launch" --timeout 130 --ps 1 -n 2 --chief -- "$trainer" --closures 200 --step-delay-ms 20 \
  --lr 0.001 --checkpoint-dir "$dir/ckpt" --checkpoint-every 40 > "$dir/train" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "the training exited $rc"
wait "$evaluator"; rc=$?
evaluator=""
[ "$rc" = 0 ] || fail "the evaluator exited $rc"
cat "$dir/eval"

# The steps the chief saved (each save's temporary directory is named in the ps task's log line).
saved=$(sed -n 's|.* to '"$dir"'/ckpt/ckpt-\([0-9]*\)\.tmp-.*|\1|p' "$dir/train" | sort -n -u | tr '\n' ' ')
evaluated=$(sed -n 's/^evaluator: step \([0-9]*\) .*/\1/p' "$dir/eval" | tr '\n' ' ')
echo "saved: $saved; evaluated: $evaluated"
[ -n "$saved" ] || fail "the training saved no checkpoint"
[ "$evaluated" = "$saved" ] || fail "evaluated steps '$evaluated', expected every saved step once, in order: '$saved'"
[ "$(echo "$evaluated" | wc -w)" -ge 3 ] || fail "fewer than 3 checkpoints evaluated"
[ "$(echo "$evaluated" | awk '{ print $NF }')" = 200 ] || fail "the last checkpoint evaluated is not step 200"
grep -q "skipping" "$dir/eval" && fail "the evaluator skipped a checkpoint"
loss() { sed -n 's/^evaluator: step .* eval_loss=\([0-9.e+-]*\) .*/\1/p' "$dir/eval" | sed -n "$1"; }
first=$(loss 1p); last=$(loss '$p')
awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 0 && l > 0 && l < f / 2) }' ||
  fail "eval_loss did not fall to below half: first $first, last $last"
grep -q "eval_accuracy=" "$dir/eval" || fail "no eval_accuracy"
events=$(ls "$dir"/logs/events.out.tfevents.* 2>/dev/null)
[ "$(echo "$events" | wc -w)" = 1 ] || fail "expected one event file in $dir/logs, found: $events"
grep -q -a "eval_loss" "$events" && grep -q -a "eval_accuracy" "$events" || fail "the event file lacks the eval scalars"
echo PASSED
