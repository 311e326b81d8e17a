#!/usr/bin/env bash
# A program that cannot start its replicas' threads (address space capped with ulimit -v, far more
# replicas than fit) must exit non-zero at once with an error that says so, never hang.
# Usage: thread_limit_check.sh MLP_CLASSIFIER
set -u
prog="$1"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
(ulimit -v 2000000; timeout 60 "$prog" --epochs 1 --replicas 300) > "$out" 2>&1
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "FAILED: $prog --replicas 300 under ulimit -v 2000000 hung (killed after 60 s)"
  cat "$out"
  exit 1
fi
if [ "$rc" = 0 ]; then
  echo "FAILED: $prog --replicas 300 under ulimit -v 2000000 exited 0"
  cat "$out"
  exit 1
fi
if ! grep -q "cannot start the thread of replica [0-9]* of 300: .*ulimit" "$out"; then
  echo "FAILED: $prog exited $rc without naming the thread it could not start"
  cat "$out"
  exit 1
fi
echo "PASSED: $prog exited $rc naming the replica thread it could not start"
