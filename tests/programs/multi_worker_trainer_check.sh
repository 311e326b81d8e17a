#!/usr/bin/env bash
# multi_worker_trainer on 2 workers x 2 replicas, started by troupe-launch, checked on its exit code
# and on every rank's result line:
# - every rank exits 0 and reports workers=2 replicas=4 and an accuracy of at least 0.9;
# - every rank reports the same loss and the same weights_digest (the workers are synchronised);
# - the loss equals a one-worker run's over the same global batch, and the digest differs from it
#   (the float32 gradient sums run in another order).
# Usage: multi_worker_trainer_check.sh TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
launch="$1"
trainer="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.out; do echo "--- $f"; cat "$f"; done
  exit 1
}

"$launch" -n 2 --devices-per-worker 2 --timeout 100 -- "$trainer" --epochs 2 > "$dir/two.out" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "the 2-worker run exited $rc"
"$launch" -n 1 --devices-per-worker 2 --timeout 100 -- "$trainer" --epochs 2 > "$dir/one.out" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "the 1-worker run exited $rc"

# field RANK KEY FILE: the value of KEY= on RANK's result line.
field() {
  grep "^\[rank $1\] result:" "$4" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

for r in 0 1; do
  line=$(grep -c "^\[rank $r\] result: workers=2 replicas=4 " "$dir/two.out")
  [ "$line" = 1 ] || fail "rank $r printed $line result lines with workers=2 replicas=4 (expected 1)"
  acc=$(field $r accuracy x "$dir/two.out")
  python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" || fail "rank $r accuracy $acc < 0.9"
done
loss0=$(field 0 loss x "$dir/two.out"); loss1=$(field 1 loss x "$dir/two.out")
digest0=$(field 0 weights_digest x "$dir/two.out"); digest1=$(field 1 weights_digest x "$dir/two.out")
[ -n "$digest0" ] || fail "rank 0 printed no weights_digest"
[ "$loss0" = "$loss1" ] || fail "the ranks' losses differ: $loss0 and $loss1"
[ "$digest0" = "$digest1" ] || fail "the ranks' weights differ: digests $digest0 and $digest1"

grep -q "^\[rank 0\] result: workers=1 replicas=2 " "$dir/one.out" || fail "the 1-worker run printed no result line"
loss_one=$(field 0 loss x "$dir/one.out"); digest_one=$(field 0 weights_digest x "$dir/one.out")
# Synchronised, the two workers compute what one worker computes over the same global batch: the
# same loss (reduced in float64, so the order of the sums does not show), while the weights'
# float32 sums, added in another order, differ in their last bits.
python3 -c "import sys; sys.exit(0 if abs(float('$loss0') - float('$loss_one')) <= 1e-6 * abs(float('$loss_one')) else 1)" ||
  fail "the 2-worker loss $loss0 is not the 1-worker loss $loss_one over the same global batch"
[ "$digest_one" != "$digest0" ] || fail "the 2-worker weights equal the unsynchronised 1-worker weights"
# Its port held by another process, the chief cannot listen: it names the address and exits 98,
# the status troupe-launch starts a cluster of ports it picked again on (launch_restart_test.cpp).
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True); time.sleep(60)' > "$dir/holder.port" &
holder=$!
trap 'kill $holder 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do [ -s "$dir/holder.port" ] && break; sleep 0.05; done
held=$(cat "$dir/holder.port")
[ -n "$held" ] || fail "no process holds a port"
TF_CONFIG="{\"cluster\": {\"worker\": [\"127.0.0.1:$held\", \"127.0.0.1:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
  timeout 30 "$trainer" --epochs 1 > "$dir/held.out" 2>&1
rc=$?
[ "$rc" = 98 ] || fail "the chief whose port $held is held exited $rc (expected 98)"
grep -q "^multi_worker_trainer: rendezvous: the chief cannot listen on 127.0.0.1:$held: .*: Address already in use$" "$dir/held.out" ||
  fail "the chief does not say that it cannot listen on 127.0.0.1:$held, which is in use"
kill "$holder"

echo "PASSED 2 synchronised workers: loss $loss0, weights $digest0 on both ranks (one worker alone: loss $loss_one, weights $digest_one)"
