#!/usr/bin/env bash
# mlp_classifier as a real process, stopped by signals and by a non-finite loss:
# - SIGINT and SIGTERM during training: the step finishes, a checkpoint of that step is written,
#   the exit status is 130 or 143 and stderr names the signal and the step; --resume continues
#   from that step and runs exactly the steps left;
# - SIGINT without --checkpoint-dir: exit 130, saying nothing was saved;
# - a learning rate that makes the loss NaN: exit 1 naming the step (TerminateOnNaN), and no
#   checkpoint of that step or after it.
# Every process is bounded in time and killed on exit. The signal goes to the trainer itself, not to
# the timeout that runs it: timeout forwards a signal it gets both to its child and to its process
# group, so the trainer would get it twice, and a second SIGINT/SIGTERM ends it at once, by design.
# Usage: fit_signal_check.sh MLP_CLASSIFIER
set -u
mlp="$1"
dir="$(mktemp -d)"
pid=""
cleanup() {
  # timeout leads a process group of its own: the whole group goes, the trainer with it.
  [ -n "$pid" ] && { kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null; }
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}

# 2048 examples in global batches of 256: 8 steps per epoch, a few ms each.
common=(--samples 2048 --batch 256 --replicas 2 --hidden 32)

# interrupt NAME SIGNAL EXPECTED_RC [ARGS...]: starts a long run, waits for its third epoch, sends
# the signal, and checks how it ended. Sets $step to the step it names.
interrupt() {
  local name="$1" sig="$2" want="$3"
  shift 3
  timeout 120 "$mlp" "${common[@]}" --epochs 100000 "$@" > "$dir/$name.out" 2> "$dir/$name.err" &
  pid=$!
  for _ in $(seq 600); do
    grep -q "^Epoch 3/" "$dir/$name.out" 2>/dev/null && break
    sleep 0.05
  done
  grep -q "^Epoch 3/" "$dir/$name.out" || fail "$name: no third epoch within 30 s"
  local trainer
  trainer=$(pgrep -P "$pid")
  [ -n "$trainer" ] || fail "$name: no trainer process under timeout $pid"
  kill -s "$sig" "$trainer"
  local rc=""
  for _ in $(seq 600); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "$name: still running 30 s after $sig"
  wait "$pid"
  rc=$?
  pid=""
  [ "$rc" = "$want" ] || fail "$name: exit status $rc after $sig (expected $want)"
  step=$(sed -n "s/.*interrupted by $sig at step \([0-9]*\).*/\1/p" "$dir/$name.err" | head -1)
  [ -n "$step" ] || fail "$name: stderr does not say 'interrupted by $sig at step N'"
}

for sig in SIGINT SIGTERM; do
  want=130
  [ "$sig" = SIGTERM ] && want=143
  ckpt="$dir/ckpt-$sig"
  interrupt "$sig" "$sig" "$want" --checkpoint-dir "$ckpt" --checkpoint-every 1000000
  [ -f "$ckpt/ckpt-$step.ckpt" ] || fail "$sig: no checkpoint of step $step in $ckpt: $(ls "$ckpt")"
  grep -q "checkpoint $ckpt/ckpt-$step.ckpt saved (continue with --resume)" "$dir/$sig.err" ||
    fail "$sig: stderr does not name the checkpoint saved"
  # Resume and finish the epoch after the one interrupted.
  epochs=$((step / 8 + 2))
  timeout 120 "$mlp" "${common[@]}" --epochs "$epochs" --checkpoint-dir "$ckpt" --resume \
    > "$dir/$sig-resume.out" 2> "$dir/$sig-resume.err"
  rc=$?
  [ "$rc" = 0 ] || fail "$sig: the resumed run exited $rc"
  grep -q "resumed from $ckpt/ckpt-$step.ckpt at step $step" "$dir/$sig-resume.out" ||
    fail "$sig: the resumed run did not start at step $step"
  grep -q "^result: .* steps=$((epochs * 8 - step)) " "$dir/$sig-resume.out" ||
    fail "$sig: the resumed run did not run the $((epochs * 8 - step)) steps left"
done

interrupt nodir SIGINT 130
grep -q "no --checkpoint-dir: the training done is not saved" "$dir/nodir.err" ||
  fail "nodir: stderr does not say that nothing was saved"

# SGD at a rate of 1e6 overflows within a few steps.
nan="$dir/ckpt-nan"
timeout 120 "$mlp" "${common[@]}" --epochs 5 --optimizer sgd --lr 1e6 --checkpoint-dir "$nan" --checkpoint-every 1 \
  > "$dir/nan.out" 2> "$dir/nan.err"
rc=$?
[ "$rc" = 1 ] || fail "nan: exit status $rc (expected 1)"
bad=$(sed -n 's/.*TerminateOnNaN: the loss is [-a-z]* at step \([0-9]*\).*/\1/p' "$dir/nan.err" | head -1)
[ -n "$bad" ] || fail "nan: stderr does not name the step whose loss was not finite"
for f in "$nan"/ckpt-*.ckpt; do
  [ -f "$f" ] || continue
  s=$(basename "$f" .ckpt)
  s=${s#ckpt-}
  [ "$s" -lt "$bad" ] || fail "nan: checkpoint $f written at or after step $bad"
done
grep -q "result:" "$dir/nan.out" && fail "nan: a result line was printed after a non-finite loss"
echo "PASSED SIGINT and SIGTERM save and resume, no-dir SIGINT, NaN at step $bad stops without a later checkpoint"
