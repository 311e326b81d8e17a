#!/usr/bin/env bash
# Every program given: an unknown flag exits 2, with a message that names the flag and points at
# --help (never CLI11's own exit codes, never a crash).
#   bad_flag_test.sh EXPECT_SH PROGRAM...
set -uo pipefail
expect="$1"
shift
if [[ $# -lt 1 ]]; then
  echo "bad_flag_test: no program given" >&2
  exit 1
fi
failed=0
for program in "$@"; do
  if ! "$expect" 2 --match "--bogus-flag" --match "--help" -- "$program" --bogus-flag > /dev/null; then
    echo "bad_flag_test: FAILED: $program --bogus-flag" >&2
    failed=1
  fi
done
[[ $failed -eq 0 ]] || exit 1
echo "bad_flag_test: $# programs exit 2 for an unknown flag"
