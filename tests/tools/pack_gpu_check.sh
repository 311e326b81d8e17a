#!/usr/bin/env bash
# tools/pack-gpu.sh packs a folder that runs on its own, and bench/gpu_training_bench.sh reads
# the trainers' result lines into its table:
#   1. the pack holds the GPU tests, the NCCL benchmark, mlp_classifier and the training bench, and
#      no cuBLAS or cuDNN (the GPU machine has them); its gpu_run.sh runs every test program
#      (each passes, or skips with 77 where there is no GPU) and ends with its summary line;
#   2. gpu_training_bench.sh, given a stand-in trainer that prints a known result line and a
#      Python without PyTorch, tabulates the trainer's figures, says PyTorch is missing, and skips
#      bf16 where the trainer has no --mixed-precision;
#   3. host_scaling.sh runs from the pack and tabulates troupe's ring and fit;
#   4. ring_sweep.sh runs from the pack and tabulates every setting against the default;
#   5. tag_cost_host.sh runs from the pack in one command (PACK/bin OUT) and tabulates the tags'
#      cost, in line and beside, with the packed frame_tag_bench's and bulk_tag_bench's rows.
#
#   pack_gpu_check.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

"$src/tools/pack-gpu.sh" "$tmp/pack" "$build" >"$tmp/pack.log" 2>&1 || { cat "$tmp/pack.log"; fail "pack-gpu.sh"; }
for f in bin/troupe_gpu_strategy_tests bin/troupe_gpu_kernel_tests bin/mlp_classifier bin/tcp_allreduce_bench \
         gpu_run.sh bench/gpu_training_bench.sh bench/torch_mlp.py bench/host_scaling.sh \
         bench/torch_gloo_allreduce.py bench/ring_sweep.sh bench/tag_cost.sh bench/tag_cost_host.sh \
         bin/frame_tag_bench bin/bulk_tag_bench PACK-INFO.txt; do
  [[ -e $tmp/pack/$f ]] || fail "the pack has no $f"
done
if ls "$tmp/pack/lib" | grep -E "^lib(cublas|cudnn|nccl|cuda\.)" >/dev/null; then
  fail "the pack carries a library the GPU machine provides: $(ls "$tmp/pack/lib" | grep -E '^lib(cublas|cudnn|nccl|cuda\.)')"
fi
# The packed trainer runs from the pack's libraries alone.
LD_LIBRARY_PATH=$tmp/pack/lib "$tmp/pack/bin/mlp_classifier" --help >"$tmp/help.txt" 2>&1 ||
  fail "the packed mlp_classifier does not start: $(head -3 "$tmp/help.txt")"
grep -q -- "--devices" "$tmp/help.txt" || fail "mlp_classifier --help names no --devices"

SKIP_BENCH=1 SKIP_TRAINING=1 "$tmp/pack/gpu_run.sh" "$tmp/pack" "$tmp/results" >"$tmp/run.log" 2>&1 ||
  { tail -20 "$tmp/run.log"; fail "gpu_run.sh exited non-zero"; }
summary=$(cat "$tmp/results/summary.txt")
[[ $summary =~ tests:\ ([0-9]+)\ run,\ ([0-9]+)\ passed,\ 0\ failed,\ ([0-9]+)\ skipped ]] ||
  fail "unexpected summary: $summary"
[[ ${BASH_REMATCH[1]} -ge 3 ]] || fail "gpu_run.sh ran ${BASH_REMATCH[1]} test programs (expected at least 3)"
[[ $summary == *"training: skipped (SKIP_TRAINING=1)"* ]] || fail "unexpected summary: $summary"

# The training bench's table, from a stand-in trainer.
cat >"$tmp/fake_trainer" <<'SH'
#!/bin/sh
case " $* " in *" --help "*) echo "usage: fake_trainer --gpus N --tf32 on|off"; exit 0 ;; esac
batch=0
while [ $# -gt 0 ]; do [ "$1" = --batch ] && batch=$2; shift; done
echo "result: replicas=1 batch=$batch input=cached steps=80 samples_per_s=$((batch * 10)) accuracy=0.5 loss=1.0 peak_gpu_mib=42.5"
SH
chmod +x "$tmp/fake_trainer"
ROUNDS=3 CASES="784-256-10:256 784-4096-10:1024" PYTHON=false \
  bash "$src/bench/gpu_training_bench.sh" "$tmp/fake_trainer" "$tmp/training" >"$tmp/training.log" 2>&1 ||
  { cat "$tmp/training.log"; fail "gpu_training_bench.sh exited non-zero"; }
table=$tmp/training/training.txt
grep -q "PyTorch with CUDA not found" "$tmp/training.log" || fail "no word that PyTorch is missing"
grep -q "bf16: not measured" "$table" || fail "bf16 not said to be skipped"
grep -Eq "^784-256-256-10 +256 +fp32 +2560 +- +- +42.5" "$table" || { cat "$table"; fail "no fp32 row for 784-256-256-10"; }
grep -Eq "^784-4096-4096-10 +1024 +tf32 +10240 " "$table" || { cat "$table"; fail "no tf32 row for 784-4096-4096-10"; }
[[ $(ls "$tmp/training/runs" | wc -l) -eq 12 ]] || fail "expected 12 runs (3 rounds x 2 cases x 2 modes)"
# The host-scaling comparison runs from the pack alone (troupe's side; PyTorch named missing here).
NPROCS=2 SIZES=4096 REPS=1 ROUNDS=1 EPOCHS=1 REPLICAS="1 2" CASES="8-16-3:64" PYTHON=false \
  "$tmp/pack/bench/host_scaling.sh" "$tmp/pack/bin" "$tmp/host" >"$tmp/host.log" 2>&1 ||
  { tail -20 "$tmp/host.log"; fail "host_scaling.sh exited non-zero"; }
grep -Eq "^2 +4096 +[0-9.]+ +- +-" "$tmp/host/host_scaling.txt" || { cat "$tmp/host/host_scaling.txt"; fail "no ring row"; }
grep -Eq "^8-16-16-3 +64 +2 +[0-9]+ +[0-9.]+x" "$tmp/host/host_scaling.txt" ||
  { cat "$tmp/host/host_scaling.txt"; fail "no fit row for 2 replicas"; }
# The ring sweep runs from the pack alone: every setting a row, each against the default's time.
NPROCS=2 SIZES=262144 SEGMENTS="65536 1048576" AHEAD="on off" SPINS=50 REPS=1 ROUNDS=1 PYTHON=false \
  "$tmp/pack/bench/ring_sweep.sh" "$tmp/pack/bin" "$tmp/sweep" >"$tmp/sweep.log" 2>&1 ||
  { tail -20 "$tmp/sweep.log"; fail "ring_sweep.sh exited non-zero"; }
for setting in 65536:on:50 65536:off:50 1048576:off:50; do
  grep -Eq "^2 +262144 +$setting +[0-9.]+ +[0-9.]+ +[0-9.]+x$" "$tmp/sweep/ring_sweep.txt" ||
    { cat "$tmp/sweep/ring_sweep.txt"; fail "no ring_sweep row for $setting"; }
done
grep -Eq "^2 +262144 +1048576:on:50 +[0-9.]+ +[0-9.]+ +1.00x$" "$tmp/sweep/ring_sweep.txt" ||
  { cat "$tmp/sweep/ring_sweep.txt"; fail "the default's row is not 1.00x of itself"; }
# The tags' cost from the pack alone, as its printed command runs it: one pack, then where to write.
NPROCS=2 ROUNDS=1 SIZES=262144 BENCH_FILTER='BM_FrameTag/4096$' BULK_FILTER='BM_BulkRead/1048576/[12]/' \
  "$tmp/pack/bench/tag_cost_host.sh" "$tmp/pack/bin" "$tmp/tags" >"$tmp/tags.log" 2>&1 ||
  { tail -20 "$tmp/tags.log"; fail "tag_cost_host.sh PACK/bin OUT exited non-zero"; }
grep -Eq "^BM_FrameTag/4096 " "$tmp/tags/tag_cost_host.txt" || { cat "$tmp/tags/tag_cost_host.txt"; fail "no frame_tag_bench row"; }
for mode in 1 2; do
  grep -Eq "^BM_BulkRead/1048576/$mode/real_time .*cpu_us=" "$tmp/tags/tag_cost_host.txt" ||
    { cat "$tmp/tags/tag_cost_host.txt"; fail "no bulk_tag_bench row for a tagged 1 MiB read (mode $mode)"; }
done
grep -Eq "^\| 262144 B \| [0-9.]+ [mu]s \| [0-9.]+ [mu]s \| [0-9.]+ \| [0-9.]+ [mu]s \| [0-9.]+ \|$" "$tmp/tags/tag_cost_host.txt" ||
  { cat "$tmp/tags/tag_cost_host.txt"; fail "no row of the tags' cost in line and beside"; }
echo "pack_gpu_check: ok"
