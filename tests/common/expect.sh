#!/usr/bin/env bash
# Runs a program and checks both its exit status and its output (stdout and stderr together):
#   expect.sh STATUS [--match REGEX]... [--no-match REGEX]... [--every-line REGEX] -- COMMAND [ARGS...]
# Each REGEX is an extended regular expression (grep -E) that must (--match) or must not
# (--no-match) occur in the output, or that every line of it must match (--every-line; the output
# must then have a line). The command runs under `timeout 120`. On a mismatch the
# output is printed and the exit status is 1.
set -uo pipefail
want="$1"
shift
matches=()
no_matches=()
every_line=""
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --match) matches+=("$2"); shift 2 ;;
    --no-match) no_matches+=("$2"); shift 2 ;;
    --every-line) every_line="$2"; shift 2 ;;
    *) echo "expect.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
shift  # --
out="$(timeout 120 "$@" 2>&1)"
status=$?
fail=0
if [[ "$status" != "$want" ]]; then
  echo "expect.sh: exit status $status, expected $want" >&2
  fail=1
fi
for re in "${matches[@]}"; do
  if ! grep -Eq -- "$re" <<<"$out"; then
    echo "expect.sh: the output does not match: $re" >&2
    fail=1
  fi
done
for re in "${no_matches[@]}"; do
  if grep -Eq -- "$re" <<<"$out"; then
    echo "expect.sh: the output matches what it must not: $re" >&2
    fail=1
  fi
done
if [[ -n "$every_line" ]]; then
  if [[ -z "$out" ]]; then
    echo "expect.sh: no output, expected lines matching: $every_line" >&2
    fail=1
  elif grep -Evq -- "$every_line" <<<"$out"; then
    echo "expect.sh: a line does not match $every_line: $(grep -Ev -- "$every_line" <<<"$out" | head -1)" >&2
    fail=1
  fi
fi
if [[ $fail -ne 0 ]]; then
  echo "--- command: $*" >&2
  echo "--- output:" >&2
  printf '%s\n' "$out" >&2
  exit 1
fi
printf '%s\n' "$out"
exit 0
