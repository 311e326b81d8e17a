#!/usr/bin/env bash
# Two workers on two hosts of their own: network namespaces joined by a veth pair, with their own
# addresses (10.77.<n>.1 and .2), running the collectives scenario of mw_worker. Exits 77 (skipped,
# with a message) where the machine does not allow network namespaces.
# Usage: netns_test.sh WORKER_BINARY
set -u
worker="$1"
source "$(dirname "$0")/../common/two_hosts.sh" t 0

cluster="\"worker\": [\"$net.1:23456\", \"$net.2:23456\"]"
ip netns exec "$a" env TROUPE_CLUSTER_TOKEN="netns-$$" TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
  timeout 60 "$worker" collectives > "$dir/out0" 2>&1 &
p0=$!
ip netns exec "$b" env TROUPE_CLUSTER_TOKEN="netns-$$" TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"worker\", \"index\": 1}}" \
  timeout 60 "$worker" collectives > "$dir/out1" 2>&1 &
p1=$!
wait $p0; r0=$?
wait $p1; r1=$?
fail() {
  echo "FAILED: $*"
  cat "$dir/out0" "$dir/out1"
  exit 1
}
[ "$r0" = 0 ] && [ "$r1" = 0 ] || fail "workers exited $r0 and $r1"
for i in 0 1; do
  grep -qx "replicas 2 workers 2 task worker:$i" "$dir/out$i" || fail "worker $i did not see a cluster of 2 workers"
  grep -qx "OK $i" "$dir/out$i" || fail "worker $i did not print 'OK $i'"
done
echo "PASSED two workers in separate network namespaces ($net.1, $net.2)"
