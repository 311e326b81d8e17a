#!/usr/bin/env bash
# Training throughput of examples/mlp_classifier (the generated set: 16384 examples, 32 features,
# 4 classes; 32 -> HIDDEN relu -> HIDDEN relu -> 4; Adam) with 1, 2 and 4 CPU replicas of a
# MirroredStrategy, and the share of training time replica 0 spends in the gradient all-reduce
# (its wait for slower replicas included: on a machine with fewer cores than replicas that wait
# is most of it).
#
# Two inputs: "pipeline" shuffles and batches every step on the input pipeline's thread (the
# example's default); "cached" repeats the first epoch's batches (--cached-batches), which takes
# the input cost out and leaves training alone.
#
# Every case runs ROUNDS times, the cases interleaved round by round so that a noisy neighbour
# hits all of them alike; each run reports the median samples/s over its epochs. The table shows
# the median over rounds and the range.
#
#   bench/training_bench.sh [BUILD_DIR]
#   env: ROUNDS=5 EPOCHS=6 BATCHES="256 64" REPLICAS="1 2 4" INPUTS="pipeline cached" HIDDEN=128
set -euo pipefail

build_dir=${1:-build}
bin="$build_dir/examples/mlp_classifier"
if [[ ! -x "$bin" ]]; then
  echo "training_bench: $bin not found; build it first: cmake --build $build_dir --target mlp_classifier" >&2
  exit 2
fi
rounds=${ROUNDS:-5}
epochs=${EPOCHS:-6}
batches=${BATCHES:-"256 64"}
replicas_list=${REPLICAS:-"1 2 4"}
inputs=${INPUTS:-"pipeline cached"}
hidden=${HIDDEN:-128}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "mlp_classifier: hidden $hidden, $epochs epochs per run, $rounds rounds; $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p'))" >&2
for ((round = 1; round <= rounds; ++round)); do
  for input in $inputs; do
    flag=""
    [[ "$input" == cached ]] && flag="--cached-batches"
    for batch in $batches; do
      for n in $replicas_list; do
        line=$("$bin" --quiet $flag --replicas "$n" --batch "$batch" --epochs "$epochs" --hidden "$hidden" | grep '^result:')
        echo "$line" >> "$tmp/$input-b$batch-r$n"
        echo "round $round: $line" >&2
      done
    done
  done
done

# One row per case: median and range of samples/s and of the all-reduce share, and the training
# accuracy of the last run. Prints the median samples/s on stderr for the speedup column.
summarise() {
  awk -v base="$2" -v input="$3" '
    function field(name,   i, kv) { for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == name) return kv[2] } }
    { rate[NR] = field("samples_per_s"); share[NR] = field("allreduce_share"); acc = field("accuracy");
      batch = field("batch"); n = field("replicas") }
    function median(a, count,   i, j, t, b) {
      for (i = 1; i <= count; ++i) b[i] = a[i]
      for (i = 1; i <= count; ++i) for (j = i + 1; j <= count; ++j) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
      lo = b[1]; hi = b[count]
      return count % 2 ? b[(count + 1) / 2] : (b[count / 2] + b[count / 2 + 1]) / 2
    }
    END {
      r = median(rate, NR); rlo = lo; rhi = hi
      s = median(share, NR); slo = lo; shi = hi
      speedup = base > 0 ? sprintf("%.2fx", r / base) : "1.00x"
      printf "| %s | %d | %d | %.0f | %.0f-%.0f | %s | %.1f %% | %.1f-%.1f %% | %.2f %% |\n",
             input, batch, n, r, rlo, rhi, speedup, 100 * s, 100 * slo, 100 * shi, 100 * acc
      print r > "/dev/stderr"
    }' "$1"
}

echo "| input | global batch | replicas | samples/s (median) | range | vs 1 replica | all-reduce share (median) | range | training accuracy |"
echo "|---|---|---|---|---|---|---|---|---|"
for input in $inputs; do
  for batch in $batches; do
    base=0
    for n in $replicas_list; do
      summarise "$tmp/$input-b$batch-r$n" "$base" "$input" 2>"$tmp/rate"
      if [[ "$base" == 0 ]]; then base=$(cat "$tmp/rate"); fi
    done
  done
done
