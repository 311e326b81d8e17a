#!/usr/bin/env bash
# Installs the dependencies, builds troupe (library, examples, tests, benchmarks) and runs every
# test. The build goes to ./build unless TROUPE_BUILD_DIR says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
build="${TROUPE_BUILD_DIR:-build}"
jobs="$(nproc)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs"
