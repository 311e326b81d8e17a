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

# shellcheck source=../lib/cluster_common.sh
source "$(dirname "$0")/../lib/cluster_common.sh"

# One run on freshly picked ports; the chief (worker 0) binds its port, and says it cannot listen
# when another process took it in between: then retry_if_taken runs it again on fresh ports.
run_workers() {
  local list="" i
  read -r -a ports <<< "$(free_ports "$workers")"
  for i in $(seq 0 $((workers - 1))); do list+="${list:+, }\"127.0.0.1:${ports[$i]}\""; done
  pids=()
  for i in $(seq 0 $((workers - 1))); do
    env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
        TROUPE_DEVICES_PER_WORKER="$replicas" timeout 60 "$program" > "$dir/out$i" 2>&1 &
    pids+=($!)
  done
  status=0
  for i in $(seq 0 $((workers - 1))); do
    wait "${pids[$i]}" || { echo "worker $i exited with status $?"; status=1; }
    if [ "$i" = 0 ] && port_taken 0; then  # the others would wait for the chief to their timeout
      for p in "${pids[@]:1}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
      return
    fi
  done
}
log_of() { echo "$dir/out$1"; }
retry_if_taken "$dir/out0" run_workers
[ "$status" = 0 ] || fail "a worker failed"
for i in $(seq 0 $((workers - 1))); do
  grep -qx "replicas $((workers * replicas)) workers $workers" "$dir/out$i" || fail "worker $i did not join a cluster of $workers"
  grep -qx "OK $i" "$dir/out$i" || fail "worker $i did not report OK"
  [ "$(grep '^moving' "$dir/out$i")" = "$(grep '^moving' "$dir/out0")" ] || fail "worker $i's moving statistics differ from worker 0's"
done
echo "PASSED: SyncBatchNormalization across $workers workers of $replicas replicas equals BatchNormalization on the global batch"
