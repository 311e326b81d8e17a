#!/usr/bin/env bash
# Runs troupe's GPU suite on a GPU machine: every GPU test program (troupe_gpu_*), the NCCL
# all-reduce benchmark (allreduce_nccl_bench), then Model::fit beside PyTorch on the same GPU
# (gpu_training_bench.sh with mlp_classifier), from a folder made by tools/pack-gpu.sh or from a
# build tree. NCCL and cuBLAS are looked for in PyTorch's nvidia-* Python packages as well (their
# lib/ folders go after LD_LIBRARY_PATH), which is where the GPU machines lent here have them.
#
#   gpu_run.sh [DIR] [OUT]
#
# DIR: a packed folder (DIR/bin, DIR/lib) or a build tree (DIR/tests, DIR/bench). Default: the
# folder this script is in when it holds bin/ (a packed copy), else its parent when that holds
# bin/ and lib/, else the build tree of the source checkout it belongs to ($TROUPE_BUILD_DIR,
# else build/). OUT: where the logs go (default ./gpu-results):
#   OUT/system.txt              nvidia-smi -L, nvidia-smi, nvidia-smi topo -m, the NCCL loaded
#   OUT/<test>.log              each test's output
#   OUT/allreduce_nccl_bench.log, .json   the benchmark's table and its JSON
#   OUT/training/training.txt   the training table (troupe vs PyTorch), runs in OUT/training/runs/
#   OUT/summary.txt             the final summary line
#
# A test passes with exit status 0, is skipped with 77 (no GPU), fails otherwise (124: timed out).
# Exits 1 when a test failed or the benchmark failed (non-zero exit or a benchmark stopped with
# an error, e.g. a wrong sum), else 0.
#
# Environment: BENCH_ARGS (extra benchmark flags, e.g. "--benchmark_filter=/1/iterations" for one GPU),
# SKIP_BENCH=1 (tests only), SKIP_TRAINING=1 (no training comparison), TRAINING_ENV (e.g.
# "ROUNDS=1 EPOCHS=3" for gpu_training_bench.sh), TEST_TIMEOUT (seconds per test, default 600), BENCH_TIMEOUT
# (seconds, default 0: none). LD_LIBRARY_PATH is kept after DIR/lib, so a NCCL installed outside
# the default library path can be named there.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ $# -ge 1 && -n $1 ]]; then
  dir=$1
elif [[ -d $here/bin ]]; then
  dir=$here
elif [[ -d $here/../bin && -d $here/../lib ]]; then
  dir=$here/..
else
  dir=${TROUPE_BUILD_DIR:-$here/../build}
fi
[[ -d $dir ]] || { echo "gpu_run.sh: $dir not found" >&2; exit 2; }
dir=$(cd "$dir" && pwd)
out=${2:-./gpu-results}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)

if [[ -d $dir/bin ]]; then
  layout=packed
  test_dir=$dir/bin
  bench=$dir/bin/allreduce_nccl_bench
  trainer=$dir/bin/mlp_classifier
  training_bench=$dir/bench/gpu_training_bench.sh
  export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif [[ -d $dir/tests || -d $dir/bench ]]; then
  layout="build tree"
  test_dir=$dir/tests
  bench=$dir/bench/allreduce_nccl_bench
  trainer=$dir/examples/mlp_classifier
  training_bench=$here/gpu_training_bench.sh
  export LD_LIBRARY_PATH=$dir/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  echo "gpu_run.sh: $dir is neither a packed folder (bin/, lib/) nor a build tree (tests/, bench/)" >&2
  exit 2
fi

# NCCL, cuBLAS and cuDNN from PyTorch's nvidia-* packages, after what LD_LIBRARY_PATH names.
for package in nccl cublas cudnn; do
  lib=$(python3 -c "import nvidia.$package, os; print(os.path.join(list(nvidia.$package.__path__)[0], 'lib'))" \
        2>/dev/null) || continue
  [[ -d $lib ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib
done

TEST_TIMEOUT=${TEST_TIMEOUT:-600}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-0}
with_timeout() {  # with_timeout SECONDS CMD...: 0 seconds or no timeout(1) runs CMD as is
  local s=$1
  shift
  # Line-buffered output, so that what a program printed before it crashed reaches the log.
  if command -v stdbuf >/dev/null; then set -- stdbuf -oL -eL "$@"; fi
  if [[ $s != 0 ]] && command -v timeout >/dev/null; then
    timeout --kill-after=30 "$s" "$@"
  else
    "$@"
  fi
}

echo "gpu_run: $dir ($layout), results in $out"
{
  echo "== host: $(uname -n) $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") $(uname -r)"
  [[ -f $dir/PACK-INFO.txt ]] && { echo "== pack"; cat "$dir/PACK-INFO.txt"; }
  if command -v nvidia-smi >/dev/null; then
    echo "== nvidia-smi -L"
    nvidia-smi -L 2>&1
    echo "== nvidia-smi"
    nvidia-smi 2>&1
    echo "== nvidia-smi topo -m"
    nvidia-smi topo -m 2>&1
  else
    echo "== nvidia-smi: not found"
  fi
  probe=$bench
  if [[ ! -x $probe ]]; then
    for probe in "$test_dir"/troupe_gpu_*; do break; done
  fi
  if [[ -x $probe ]]; then
    echo "== libraries of $(basename "$probe") (ldd)"
    ldd "$probe" 2>&1
  fi
} >"$out/system.txt"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L 2>&1
else
  echo "nvidia-smi: not found"
fi
grep -E "libnccl|not found" <(sed -n '/^== libraries/,$p' "$out/system.txt") | sed 's/^\s*/  ldd: /'

passed=0 failed=0 skipped=0
failed_names=()
shopt -s nullglob
tests=("$test_dir"/troupe_gpu_*)
shopt -u nullglob
for t in "${tests[@]}"; do
  [[ -f $t && -x $t ]] || continue
  name=$(basename "$t")
  log=$out/$name.log
  echo "---- $name"
  with_timeout "$TEST_TIMEOUT" "$t" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=PASS; passed=$((passed + 1)) ;;
    77) status=SKIP; skipped=$((skipped + 1)) ;;
    124 | 137) status="FAIL (timed out after ${TEST_TIMEOUT} s)"; failed=$((failed + 1)); failed_names+=("$name") ;;
    *) status="FAIL (exit status $rc)"; failed=$((failed + 1)); failed_names+=("$name") ;;
  esac
  echo "---- $name: $status" | tee -a "$log"
done
ntests=$((passed + failed + skipped))
[[ $ntests -gt 0 ]] || echo "gpu_run: no troupe_gpu_* programs in $test_dir"

bench_status="not run"
bench_failed=0
if [[ ${SKIP_BENCH:-0} == 1 ]]; then
  bench_status="skipped (SKIP_BENCH=1)"
elif [[ ! -x $bench ]]; then
  bench_status="not found ($bench)"
else
  echo "---- allreduce_nccl_bench"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  with_timeout "$BENCH_TIMEOUT" "$bench" --benchmark_counters_tabular=true \
    --benchmark_out="$out/allreduce_nccl_bench.json" --benchmark_out_format=json ${BENCH_ARGS:-} 2>&1 |
    tee "$out/allreduce_nccl_bench.log"
  rc=${PIPESTATUS[0]}
  errors=$(grep -c "ERROR OCCURRED" "$out/allreduce_nccl_bench.log")
  measured=$(grep -E "^BM_" "$out/allreduce_nccl_bench.log" | grep -vc "ERROR OCCURRED")
  if [[ $rc -ne 0 ]]; then
    bench_status="FAIL (exit status $rc)"
    bench_failed=1
  elif grep -q "no GPU found" "$out/allreduce_nccl_bench.log"; then
    bench_status="nothing measured (no GPU)"
  elif [[ $errors -gt 0 ]]; then
    bench_status="FAIL ($measured measured, $errors stopped with an error)"
    bench_failed=1
  else
    bench_status="$measured measured"
  fi
fi

training_status="not run"
training_failed=0
if [[ ${SKIP_TRAINING:-0} == 1 ]]; then
  training_status="skipped (SKIP_TRAINING=1)"
elif [[ ! -x $trainer || ! -f $training_bench ]]; then
  training_status="not found ($trainer, $training_bench)"
elif [[ ! -e /dev/nvidiactl && ! -e /dev/nvidia0 ]]; then
  training_status="nothing measured (no GPU)"
else
  echo "---- gpu_training_bench"
  # shellcheck disable=SC2086  # TRAINING_ENV is a list of settings
  env ${TRAINING_ENV:-} bash "$training_bench" "$trainer" "$out/training"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    training_status="FAIL (exit status $rc)"
    training_failed=1
  else
    training_status="measured ($out/training/training.txt)"
  fi
fi

summary="gpu_run: tests: $ntests run, $passed passed, $failed failed, $skipped skipped"
[[ $failed -gt 0 ]] && summary+=" (failed: ${failed_names[*]})"
summary+="; bench: $bench_status; training: $training_status; logs in $out"
echo "$summary" >"$out/summary.txt"
echo "$summary"
[[ $failed -eq 0 && $bench_failed -eq 0 && $training_failed -eq 0 ]]
