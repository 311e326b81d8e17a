#!/usr/bin/env bash
# Two multi_worker_trainer workers on loopback; SIGINT goes to the chief only. Both must stop after
# the same step (the decision is agreed in a collective, so the other worker neither hangs nor
# runs ahead): both exit 130, report the same step and the same weights, the chief names SIGINT,
# the other worker names the chief, only the chief prints progress, and a checkpoint of that step
# is written. Every process is bounded in time and killed on exit.
# Usage: multi_worker_stop_check.sh MULTI_WORKER_TRAINER
set -u
trainer="$1"
dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}

# The chief binds its port; another process may have taken it since it was picked: the chief then
# says it cannot listen and ends at once, and both start again on fresh ports (up to 3 times).
for attempt in 1 2 3; do
  read -r -a ports <<< "$(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
  cluster="\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\""
  pids=()
  for i in 0 1; do
    env TF_CONFIG="{\"cluster\": {\"worker\": [$cluster]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      "$trainer" --epochs 100000 --batch 512 --checkpoint-dir "$dir/ckpt" > "$dir/w$i.out" 2> "$dir/w$i.err" &
    pids+=($!)
  done
  for _ in $(seq 1200); do
    grep -q "^Epoch 2/" "$dir/w0.out" 2>/dev/null && break
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.05
  done
  grep -q "cannot listen" "$dir/w0.err" 2>/dev/null || break
  echo "a port was taken (attempt $attempt): $(grep -h 'cannot listen' "$dir/w0.err" | head -n 1)"
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ "$attempt" = 3 ] && fail "no free ports after 3 tries"
done
grep -q "^Epoch 2/" "$dir/w0.out" || fail "the chief printed no second epoch within 60 s"
kill -s INT "${pids[0]}"
for i in 0 1; do
  for _ in $(seq 600); do
    kill -0 "${pids[$i]}" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "${pids[$i]}" 2>/dev/null && fail "worker $i still runs 30 s after the chief's SIGINT"
  wait "${pids[$i]}"
  rc=$?
  [ "$rc" = 130 ] || fail "worker $i exited $rc (expected 130)"
done
pids=()

line0=$(grep "^stopped: " "$dir/w0.out")
line1=$(grep "^stopped: " "$dir/w1.out")
[ -n "$line0" ] || fail "the chief printed no stopped line"
[ "$line0" = "$line1" ] || fail "the workers stopped differently: '$line0' and '$line1'"
step=$(echo "$line0" | sed -n 's/^stopped: step=\([0-9]*\) .*/\1/p')
grep -q "interrupted by SIGINT at step $step" "$dir/w0.err" || fail "the chief does not name SIGINT at step $step"
grep -q "stop requested by worker 0 at step $step" "$dir/w1.err" || fail "worker 1 does not name the chief's request"
[ -f "$dir/ckpt/ckpt-$step.ckpt" ] || fail "no checkpoint of step $step: $(ls "$dir/ckpt")"
grep -q "^Epoch " "$dir/w1.out" && fail "worker 1 printed progress (only the chief should)"
echo "PASSED the chief's SIGINT stopped both workers after step $step with the same weights; checkpoint written"
