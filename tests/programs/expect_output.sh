#!/usr/bin/env bash
# Runs a program and passes only when it exits 0 and prints exactly the expected text (stdout; its
# stderr is shown on failure). Usage: expect_output.sh EXPECTED_FILE PROGRAM [ARGS...]
set -u
expected="$1"
shift
out="$(mktemp)"
err="$(mktemp)"
trap 'rm -f "$out" "$err"' EXIT
timeout 100 "$@" > "$out" 2> "$err"
rc=$?
if [ "$rc" != 0 ]; then
  echo "FAILED: $* exited $rc"
  cat "$out" "$err"
  exit 1
fi
if ! diff -u "$expected" "$out"; then
  echo "FAILED: $* printed something other than $expected (diff above: - expected, + printed)"
  cat "$err"
  exit 1
fi
echo "PASSED: $* exited 0 and printed the $(wc -l < "$expected") expected lines"
