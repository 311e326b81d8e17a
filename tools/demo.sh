#!/usr/bin/env bash
# Installs the dependencies, builds troupe and runs the seed examples on MirroredStrategy over
# CPU replicas in one process. Usage: tools/demo.sh [replicas]   (default 4)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
build="${TROUPE_BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target seed_examples >/dev/null
exec "$build/examples/seed_examples" "${1:-4}"
