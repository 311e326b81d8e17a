#!/usr/bin/env bash
# Model::fit on one GPU against PyTorch eager on the same GPU, side by side in one invocation:
# examples/mlp_classifier (--gpus 1, plain SGD, sparse cross-entropy, BATCHES cached batches, the
# loss read every step) and bench/torch_mlp.py (the same MLP, optimizer, batches and loss read),
# run alternately round by round so that both see the same machine.
#
#   bench/gpu_training_bench.sh MLP_CLASSIFIER [OUT]
#   env: ROUNDS=2 EPOCHS=5 BATCHES=16 PYTHON=python3
#        CASES="784-256-10:256 784-1024-10:4096 784-4096-10:1024"   (features-hidden-classes:batch)
#        MODES="fp32 tf32 bf16"
#
# Modes, the same on both sides:
#   fp32  exact float32 products: mlp_classifier --tf32 off; torch allow_tf32=False
#   tf32  TensorFloat-32 products: --tf32 on (TensorFlow's default); allow_tf32=True
#   bf16  Keras's mixed_bfloat16 (--mixed-precision mixed_bfloat16); torch.autocast(bfloat16).
#         Skipped, and said so, where the mlp_classifier given has no --mixed-precision.
#
# Prints a table (median samples/s over rounds, each run's own figure being its median over
# epochs; peak GPU memory held by tensors) and the ratio troupe / PyTorch; writes OUT/training.txt
# and every run's output under OUT/runs/. Exits 1 when a run fails.
set -uo pipefail

[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: bench/gpu_training_bench.sh MLP_CLASSIFIER [OUT]" >&2; exit 2; }
mlp=$1
out=${2:-./gpu-training}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
torch_mlp=$here/torch_mlp.py
python=${PYTHON:-python3}
rounds=${ROUNDS:-2}
epochs=${EPOCHS:-5}
batches=${BATCHES:-16}
cases=${CASES:-"784-256-10:256 784-1024-10:4096 784-4096-10:1024"}
modes=${MODES:-"fp32 tf32 bf16"}
[[ -x $mlp ]] || { echo "gpu_training_bench: $mlp is not an executable" >&2; exit 2; }
[[ -f $torch_mlp ]] || { echo "gpu_training_bench: $torch_mlp not found" >&2; exit 2; }
mkdir -p "$out/runs" || exit 2

have_bf16=0
# grep -q would stop reading early and, under pipefail, fail the pipeline with the SIGPIPE it causes
[[ $("$mlp" --help 2>/dev/null) == *--mixed-precision* ]] && have_bf16=1
have_torch=1
"$python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || have_torch=0
[[ $have_torch == 1 ]] || echo "gpu_training_bench: PyTorch with CUDA not found in $python: troupe alone"

field() {  # field NAME FILE: the value of NAME= on the file's result line
  sed -n 's/^result: .*\b'"$1"'=\([^ ]*\).*/\1/p' "$2" | tail -1
}

failed=0
declare -A rate peak
for ((round = 1; round <= rounds; ++round)); do
  for c in $cases; do
    shape=${c%%:*}
    batch=${c#*:}
    IFS=- read -r features hidden classes <<<"$shape"
    for mode in $modes; do
      if [[ $mode == bf16 && $have_bf16 == 0 ]]; then continue; fi
      key="$shape:$batch:$mode"
      # troupe
      args=(--gpus 1 --quiet --cached-batches --optimizer sgd --lr 0.01 --epochs "$epochs" --batch "$batch"
            --samples $((batch * batches)) --features "$features" --hidden "$hidden" --classes "$classes")
      case $mode in
        fp32) args+=(--tf32 off) ;;
        tf32) args+=(--tf32 on) ;;
        bf16) args+=(--tf32 on --mixed-precision mixed_bfloat16) ;;
      esac
      log=$out/runs/troupe-$shape-$batch-$mode-$round.txt
      if "$mlp" "${args[@]}" >"$log" 2>&1 && [[ -n $(field samples_per_s "$log") ]]; then
        rate[troupe:$key]+="$(field samples_per_s "$log") "
        peak[troupe:$key]=$(field peak_gpu_mib "$log")
      else
        echo "gpu_training_bench: troupe $key failed (round $round):" >&2
        tail -5 "$log" >&2
        failed=1
      fi
      # PyTorch
      [[ $have_torch == 1 ]] || continue
      log=$out/runs/torch-$shape-$batch-$mode-$round.txt
      if "$python" "$torch_mlp" --batch "$batch" --batches "$batches" --epochs "$epochs" --features "$features" \
          --hidden "$hidden" --classes "$classes" --lr 0.01 --math "$mode" >"$log" 2>&1 &&
          [[ -n $(field samples_per_s "$log") ]]; then
        rate[torch:$key]+="$(field samples_per_s "$log") "
        peak[torch:$key]=$(field peak_mib "$log")
      else
        echo "gpu_training_bench: PyTorch $key failed (round $round):" >&2
        tail -5 "$log" >&2
        failed=1
      fi
    done
  done
done

median() {  # median VALUES...
  printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

{
  echo "Model::fit on one GPU vs PyTorch eager, same GPU, one invocation ($rounds rounds, $epochs epochs of $batches cached batches)"
  [[ $have_bf16 == 1 ]] || echo "bf16: not measured (this mlp_classifier has no --mixed-precision)"
  printf '%-16s %-6s %-5s %14s %14s %7s %11s %11s\n' model batch math "troupe samp/s" "torch samp/s" ratio \
    "troupe MiB" "torch MiB"
  for c in $cases; do
    shape=${c%%:*}
    batch=${c#*:}
    IFS=- read -r features hidden classes <<<"$shape"
    for mode in $modes; do
      key="$shape:$batch:$mode"
      # shellcheck disable=SC2086  # the lists of rates
      t=$(median ${rate[troupe:$key]:-})
      # shellcheck disable=SC2086
      p=$(median ${rate[torch:$key]:-})
      [[ -z $t && -z $p ]] && continue
      ratio=$(awk -v t="${t:-0}" -v p="${p:-0}" 'BEGIN {if (t > 0 && p > 0) printf "%.2fx", t / p; else print "-"}')
      printf '%-16s %-6s %-5s %14s %14s %7s %11s %11s\n' "$features-$hidden-$hidden-$classes" "$batch" "$mode" "${t:--}" "${p:--}" "$ratio" \
        "${peak[troupe:$key]:--}" "${peak[torch:$key]:--}"
    done
  done
} | tee "$out/training.txt"
exit $failed
