#!/usr/bin/env python3
"""Fails when a ctest entry of the build tree can pass on its output alone.

ctest ignores the exit status of a test with PASS_REGULAR_EXPRESSION, and passes a WILL_FAIL test
whose output matches its FAIL_REGULAR_EXPRESSION whatever it exited with; FAIL_REGULAR_EXPRESSION
alone still needs exit status 0. Such a check belongs in a wrapper that checks both
(tests/common/expect.sh).

  exit_codes_checked.py CTEST BUILD_DIR
"""
import json
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: exit_codes_checked.py CTEST BUILD_DIR", file=sys.stderr)
        return 2
    ctest, build = sys.argv[1:]
    listing = subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"], capture_output=True,
                             text=True, timeout=120)
    if listing.returncode != 0:
        print(f"ctest --show-only=json-v1 failed ({listing.returncode}): {listing.stderr}", file=sys.stderr)
        return 1
    tests = json.loads(listing.stdout).get("tests", [])
    if not tests:
        print(f"ctest lists no test in {build}: nothing was checked", file=sys.stderr)
        return 1
    bad = []
    for test in tests:
        properties = {p["name"]: p.get("value") for p in test.get("properties", [])}
        if "PASS_REGULAR_EXPRESSION" in properties:
            bad.append(f'"{test["name"]}": PASS_REGULAR_EXPRESSION (ctest then ignores its exit status)')
        elif "FAIL_REGULAR_EXPRESSION" in properties and properties.get("WILL_FAIL"):
            bad.append(f'"{test["name"]}": WILL_FAIL with FAIL_REGULAR_EXPRESSION '
                       "(a match passes, whatever the exit status)")
    if bad:
        print("ctest entries that pass on their output alone; check the exit status too "
              "(tests/common/expect.sh STATUS --match REGEX -- COMMAND):\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print(f"{len(tests)} ctest entries: each one checks its exit status")
    return 0


if __name__ == "__main__":
    sys.exit(main())
