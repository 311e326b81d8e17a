#!/usr/bin/env bash
# SyncBatchNormalization across real worker processes on loopback: N workers of R local replicas
# each run mw_sync_bn; every one must print "OK <rank>" and exit 0, and all must report the same
# moving statistics, bit for bit. Every process is bounded by a timeout and killed on exit.
# Usage: sync_bn_check.sh MW_SYNC_BN_BINARY WORKERS REPLICAS_PER_WORKER
set -u
program="$1"
workers="$2"
replicas="$3"
dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for i in $(seq 0 $((workers - 1))); do echo "--- worker $i:"; cat "$dir/out$i"; done
  exit 1
}

read -r -a ports <<< "$(python3 - "$workers" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)"
list=""
for i in $(seq 0 $((workers - 1))); do list+="${list:+, }\"127.0.0.1:${ports[$i]}\""; done
for i in $(seq 0 $((workers - 1))); do
  env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      TROUPE_DEVICES_PER_WORKER="$replicas" timeout 60 "$program" > "$dir/out$i" 2>&1 &
  pids+=($!)
done
status=0
for i in $(seq 0 $((workers - 1))); do
  wait "${pids[$i]}" || { echo "worker $i exited with status $?"; status=1; }
done
[ "$status" = 0 ] || fail "a worker failed"
for i in $(seq 0 $((workers - 1))); do
  grep -qx "replicas $((workers * replicas)) workers $workers" "$dir/out$i" || fail "worker $i did not join a cluster of $workers"
  grep -qx "OK $i" "$dir/out$i" || fail "worker $i did not report OK"
  [ "$(grep '^moving' "$dir/out$i")" = "$(grep '^moving' "$dir/out0")" ] || fail "worker $i's moving statistics differ from worker 0's"
done
echo "PASSED: SyncBatchNormalization across $workers workers of $replicas replicas equals BatchNormalization on the global batch"
