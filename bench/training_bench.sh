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
#
# Side by side with TensorFlow (bench/tf_mlp.py, `pip install tensorflow-cpu`): the MLP
# FEATURES -> HIDDEN relu -> HIDDEN relu -> CLASSES, plain SGD, global batch BATCH, cached input,
# on troupe (its own CPU kernel path, and each path in PATHS forced through TROUPE_CPU), on the
# troupe builds in OTHER_BUILDS (e.g. one configured with -DCMAKE_CXX_FLAGS=-march=native) and on
# TensorFlow's MirroredStrategy, interleaved round by round. First gemm_bench measures the
# machine's reachable FLOP/s (the best float32 product rate over 1 and 2 threads) and the MLP's
# own products; training is then reported in FLOP/s against it.
#
#   bench/training_bench.sh --side-by-side [BUILD_DIR]
#   env: ROUNDS=3 EPOCHS=5 REPLICAS="1 4" BATCH=256 FEATURES=784 HIDDEN=256 CLASSES=10
#        PATHS="baseline" OTHER_BUILDS="name=dir ..." SETTINGS="name:VAR=VALUE ..." PYTHON=python3 (or the virtual environment
#        tools/install-deps.sh --bench makes)
set -euo pipefail

if [[ "${1:-}" == "--side-by-side" ]]; then
  shift
  build_dir=${1:-build}
  here=$(cd "$(dirname "$0")" && pwd)
  rounds=${ROUNDS:-3}
  epochs=${EPOCHS:-5}
  replicas_list=${REPLICAS:-"1 4"}
  batch=${BATCH:-256}
  features=${FEATURES:-784}
  hidden=${HIDDEN:-256}
  classes=${CLASSES:-10}
  paths=${PATHS:-baseline}
  python=${PYTHON:-python3}
  # tools/install-deps.sh --bench puts TensorFlow in a virtual environment when python3 lacks it.
  if ! "$python" -c "import tensorflow" 2>/dev/null && [[ -x "${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python" ]]; then
    python=${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python
  fi
  samples=16384
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # name=binary of every troupe run: this build on its own path, forced paths, other builds.
  runs=("troupe=$build_dir/examples/mlp_classifier")
  for p in $paths; do runs+=("troupe-$p=$build_dir/examples/mlp_classifier"); done
  for o in ${OTHER_BUILDS:-}; do runs+=("${o%%=*}=${o#*=}/examples/mlp_classifier"); done
  # name:VAR=VALUE runs this build with one more setting (e.g. "1-thread:TROUPE_INTRA_OP_THREADS=1").
  declare -A extra_env
  for e in ${SETTINGS:-}; do runs+=("${e%%:*}=$build_dir/examples/mlp_classifier"); extra_env[${e%%:*}]=${e#*:}; done
  for r in "${runs[@]}"; do
    [[ -x "${r#*=}" ]] || { echo "training_bench: ${r#*=} not found" >&2; exit 2; }
  done
  "$python" -c "import tensorflow" 2>/dev/null || { echo "training_bench: TensorFlow missing (pip install tensorflow-cpu)" >&2; exit 2; }
  "$build_dir/bench/gemm_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_format=json > "$tmp/gemm.json" 2>/dev/null
  path=$(sed -n 's/.*"troupe_cpu_path": "\(.*\)".*/\1/p' "$tmp/gemm.json")
  echo "machine: $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')); troupe's CPU kernel path here: $path" >&2
  # Training FLOP per sample: forward and kernel gradients 2·MACs each, input gradients of all
  # layers but the first.
  flop_per_sample=$(( 6 * (features * hidden + hidden * hidden + hidden * classes) - 2 * features * hidden ))
  for ((round = 1; round <= rounds; ++round)); do
    for n in $replicas_list; do
      common=(--replicas "$n" --batch "$batch" --epochs "$epochs" --samples "$samples" --features "$features" --hidden "$hidden" --classes "$classes")
      for r in "${runs[@]}"; do
        name=${r%%=*}; bin=${r#*=}; cpu=""
        [[ "$name" == troupe-* ]] && cpu=${name#troupe-}
        line=$(env ${cpu:+TROUPE_CPU=$cpu} ${extra_env[$name]:-} "$bin" --quiet --cached-batches --optimizer sgd --lr 0.05 "${common[@]}" 2>/dev/null | grep '^result:')
        echo "$line" >> "$tmp/$name-r$n"; echo "round $round $name: $line" >&2
      done
      line=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" "$here/tf_mlp.py" "${common[@]}" --lr 0.05 2>/dev/null | grep '^result:')
      echo "$line" >> "$tmp/tensorflow-r$n"; echo "round $round tensorflow: $line" >&2
    done
  done
  "$python" - "$tmp" "$flop_per_sample" "$replicas_list" "${runs[@]%%=*}" tensorflow <<'PY'
import json, statistics, sys
tmp, flop, replicas, names = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
gemm = {b["run_name"]: b for b in json.load(open(f"{tmp}/gemm.json"))["benchmarks"] if b.get("aggregate_name") == "median"}
rate = lambda name: gemm[name]["FLOP/s"]
one = max(rate(f"BM_Matmul/{n}/real_time/threads:1") for n in (256, 512, 1024))
two = max(rate(f"BM_Matmul/{n}/real_time/threads:2") for n in (256, 512, 1024))
reach = max(one, two)
print(f"Reachable float32 product rate (gemm_bench, medians of 3): {one / 1e9:.1f} GFLOP/s on 1 thread, "
      f"{two / 1e9:.1f} GFLOP/s on 2; the MLP's products alone: {rate('BM_MlpGemms/64/real_time') / 1e9:.1f} GFLOP/s "
      f"at batch 64 ({rate('BM_MlpGemms/64/real_time') / one:.2f} of 1 thread's), "
      f"{rate('BM_MlpGemms/256/real_time') / 1e9:.1f} at batch 256 ({rate('BM_MlpGemms/256/real_time') / one:.2f}).\n")
def field(name, n, key):
    out = []
    for line in open(f"{tmp}/{name}-r{n}"):
        kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        out.append(float(kv[key]))
    return out
samples = lambda name, n: field(name, n, "samples_per_s")
print("| replicas | " + " | ".join(names) + " | troupe / tensorflow | " +
      " | ".join(f"troupe / {m}" for m in names[1:-1]) + (" | " if len(names) > 2 else "") +
      "troupe FLOP/s, share of reachable | troupe all-reduce share |")
print("|---" * (len(names) + len(names) - 2 + 4) + "|")
for n in replicas:
    med = {m: statistics.median(samples(m, n)) for m in names}
    cells = [f"{med[m] / 1e3:.1f} k ({min(samples(m, n)) / 1e3:.1f}-{max(samples(m, n)) / 1e3:.1f})" for m in names]
    ratios = [f"{med['troupe'] / med['tensorflow']:.2f}x"] + [f"{med['troupe'] / med[m]:.2f}x" for m in names[1:-1]]
    print(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(ratios) +
          f" | {med['troupe'] * flop / 1e9:.1f} G, {med['troupe'] * flop / reach:.2f}"
          f" | {100 * statistics.median(field('troupe', n, 'allreduce_share')):.0f} % |")
PY
  exit 0
fi

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
