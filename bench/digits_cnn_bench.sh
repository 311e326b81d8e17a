#!/usr/bin/env bash
# examples/digits_cnn beside the same CNN in Keras (bench/tf_digits_cnn.py): scikit-learn's 8x8
# digits, the same layers, Adam, global batch BATCH, EPOCHS epochs, REPLICAS CPU replicas of a
# MirroredStrategy on both sides (TensorFlow's over as many logical CPU devices), interleaved
# round by round in one invocation. Reports the median samples/s over each run's epochs (Keras's
# first epoch, which traces, left out) and the test accuracy after the same epochs, with the ratio.
#
#   bench/digits_cnn_bench.sh [BUILD_DIR]
#   env: ROUNDS=3 EPOCHS=30 BATCH=64 REPLICAS=4 PYTHON=python3 (or the virtual environment
#        tools/install-deps.sh --bench makes, /opt/troupe-bench)
set -euo pipefail
build_dir=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-3}
epochs=${EPOCHS:-30}
batch=${BATCH:-64}
replicas=${REPLICAS:-4}
python=${PYTHON:-python3}
if ! "$python" -c "import tensorflow" 2>/dev/null && [[ -x "${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python" ]]; then
  python=${TROUPE_BENCH_VENV:-/opt/troupe-bench}/bin/python
fi
"$python" -c "import tensorflow" 2>/dev/null ||
  { echo "digits_cnn_bench: TensorFlow missing (tools/install-deps.sh --bench installs it)" >&2; exit 2; }
cnn="$build_dir/examples/digits_cnn"
[[ -x "$cnn" ]] || { echo "digits_cnn_bench: $cnn not found; build it first: cmake --build $build_dir --target digits_cnn" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "digits CNN: $replicas CPU replicas, batch $batch, $epochs epochs, $rounds rounds; $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')); TensorFlow $("$python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" >&2
for ((round = 1; round <= rounds; ++round)); do
  line=$("$cnn" --quiet --replicas "$replicas" --batch "$batch" --epochs "$epochs" | grep '^result:')
  echo "$line" >> "$tmp/troupe"; echo "round $round troupe: $line" >&2
  line=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" "$here/tf_digits_cnn.py" --replicas "$replicas" --batch "$batch" --epochs "$epochs" 2>/dev/null | grep '^result:')
  echo "$line" >> "$tmp/keras"; echo "round $round keras: $line" >&2
done
"$python" - "$tmp" <<'PY'
import statistics, sys
tmp = sys.argv[1]
def field(name, key):
    return [float(dict(f.split("=", 1) for f in line.split()[1:])[key]) for line in open(f"{tmp}/{name}")]
rate = {n: field(n, "samples_per_s") for n in ("troupe", "keras")}
acc = {n: field(n, "test_accuracy") for n in ("troupe", "keras")}
print("| | samples/s, median (range) | test accuracy, median (range) |")
print("|---|---|---|")
for n in ("troupe", "keras"):
    print(f"| {n} | {statistics.median(rate[n]):.0f} ({min(rate[n]):.0f}-{max(rate[n]):.0f}) | "
          f"{100 * statistics.median(acc[n]):.2f} % ({100 * min(acc[n]):.2f}-{100 * max(acc[n]):.2f}) |")
print(f"| troupe / keras | {statistics.median(rate['troupe']) / statistics.median(rate['keras']):.2f}x | |")
PY
