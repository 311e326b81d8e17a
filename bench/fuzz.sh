#!/usr/bin/env bash
# Builds troupe's libFuzzer targets (fuzz/) with clang, AddressSanitizer and UBSan in build-fuzz/,
# then runs each for SECONDS (default 60) on a copy of its seed corpus (fuzz/corpus/<target>/) and
# prints how many inputs it ran. Findings (crash-*, leak-*, timeout-* files) land in
# build-fuzz/findings/<target>/; the exit status is 1 when any target found something.
# Needs clang and libclang-rt (tools/install-deps.sh --fuzz).
# Usage: bench/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail

seconds="${1:-60}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TROUPE_FUZZ_BUILD:-$root/build-fuzz}"
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(ring_frame checkpoint tf_config rendezvous worker_report)

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (tools/install-deps.sh --fuzz installs it)" >&2
  exit 2
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTROUPE_BUILD_FUZZ=ON -DTROUPE_ENABLE_CUDA=OFF -DTROUPE_BUILD_TESTS=OFF \
  -DTROUPE_BUILD_BENCH=OFF -DTROUPE_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" --target troupe_fuzz -j"$(nproc)" >/dev/null

status=0
printf '%-12s %12s %10s %8s  %s\n' target inputs "inputs/s" corpus result
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  cp -n "$root/fuzz/corpus/$t/"* "$corpus/" 2>/dev/null || true
  log="$build/findings/$t.log"
  set +e
  # -rss_limit_mb: the targets' inputs are small; a big allocation is itself a finding.
  ASAN_OPTIONS=detect_leaks=1 "$build/fuzz/${t}_fuzz" "$corpus" -max_total_time="$seconds" \
    -artifact_prefix="$findings/" -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  runs="${runs:-$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#')}"
  size=$(ls "$corpus" | wc -l)
  result=ok
  if [[ $rc -ne 0 ]]; then
    result="FOUND (exit $rc): $(ls "$findings" | head -1), see $log"
    status=1
  fi
  printf '%-12s %12s %10s %8s  %s\n' "$t" "${runs:-?}" "$(( ${runs:-0} / (seconds > 0 ? seconds : 1) ))" "$size" "$result"
done
exit $status
