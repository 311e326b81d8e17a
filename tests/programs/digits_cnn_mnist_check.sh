#!/usr/bin/env bash
# digits_cnn --mnist DIR reads MNIST's IDX files (here small ones written by Python: 12x12 images)
# and trains on them; malformed ones are errors naming the file and the problem, with exit status 1.
# Usage: digits_cnn_mnist_check.sh DIGITS_CNN
set -u
cnn="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*"; cat "$dir/out" 2>/dev/null; exit 1; }

# write DIR N_TRAIN N_TRAIN_LABELS MAX_LABEL: an MNIST folder of 12x12 images.
write() {
  python3 - "$@" <<'PY'
import os, struct, sys
d, n, n_labels, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
def images(name, count):
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, count, 12, 12))
        f.write(bytes((i * 7 + p) % 256 for i in range(count) for p in range(144)))
def labels(name, count):
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack(">II", 0x00000801, count))
        f.write(bytes(i % (top + 1) for i in range(count)))
images("train-images-idx3-ubyte", n); labels("train-labels-idx1-ubyte", n_labels)
images("t10k-images-idx3-ubyte", 16); labels("t10k-labels-idx1-ubyte", 16)
PY
}

# expect STATUS REGEX ARGS...: digits_cnn ARGS exits STATUS and prints a line matching REGEX.
expect() {
  local status="$1" re="$2"; shift 2
  "$cnn" "$@" > "$dir/out" 2>&1
  local rc=$?
  [ "$rc" = "$status" ] || fail "digits_cnn $* exited $rc (expected $status)"
  grep -Eq "$re" "$dir/out" || fail "digits_cnn $* printed no line matching: $re"
}

write "$dir/good" 64 64 9
expect 0 "^result: workers=1 replicas=1 batch=32 epochs=1 .* test_samples=16 " --mnist "$dir/good" --replicas 1 --epochs 1 --batch 32 --quiet

write "$dir/short" 64 64 9
head -c 1000 "$dir/short/train-images-idx3-ubyte" > "$dir/cut" && mv "$dir/cut" "$dir/short/train-images-idx3-ubyte"
expect 1 "digits_cnn: read_idx: \".*/short/train-images-idx3-ubyte\" is shorter than its header says" --mnist "$dir/short"

write "$dir/count" 64 60 9
expect 1 "digits_cnn: .*/count/train-labels-idx1-ubyte: labels of shape \[60\] for 64 images in .*/count/train-images-idx3-ubyte \(expected one label per image\)" --mnist "$dir/count"

write "$dir/label" 64 64 11
expect 1 "digits_cnn: .*/label/train-labels-idx1-ubyte: label 10 is 10 \(expected a digit 0..9\)" --mnist "$dir/label"

write "$dir/missing" 64 64 9
rm "$dir/missing/t10k-labels-idx1-ubyte"
expect 1 "digits_cnn: --mnist: .*/missing/t10k-labels-idx1-ubyte is missing \(expected train-images-idx3-ubyte, " --mnist "$dir/missing"

printf '1,2,3\n' > "$dir/digits.csv"
expect 1 "digits_cnn: .*/digits.csv line 1: 3 values \(expected 65: 64 pixels and the label\)" --digits "$dir/digits.csv"
expect 1 "digits_cnn: cannot read the digits at $dir/none.csv \(tools/install-deps.sh fetches them there" --digits "$dir/none.csv"
echo "PASSED"
