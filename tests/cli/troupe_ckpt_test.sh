#!/usr/bin/env bash
# troupe-ckpt on checkpoints written by a real training run (mlp_classifier):
#   troupe_ckpt_test.sh TROUPE_CKPT MLP_CLASSIFIER EXPECT_SH
# a directory lists its checkpoints; --stats prints min/max/mean and flags the NaN of a diverged
# run (whose checksums all pass); a damaged file and an empty directory exit 1; usage exits 2.
set -euo pipefail
ckpt="$1" mlp="$2" expect="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$expect" 0 --match "result: " -- "$mlp" --epochs 2 --samples 2048 --checkpoint-dir "$work/good" \
  --checkpoint-every 4 --quiet >/dev/null
"$expect" 0 --match "good: 3 checkpoints, oldest first" --match "ckpt-8\.ckpt +step 8, 19 variables, [0-9]+ bytes, intact" \
  --match "ckpt-16\.ckpt +step 16, 19 variables" --no-match "ckpt-4\.ckpt" -- "$ckpt" "$work/good"
"$expect" 0 --match "dense_0/kernel +float32 +\[32, 128\] +16384 bytes +ok +min -?[0-9.e-]+ +max [0-9.e-]+ +mean" \
  --no-match "NON-FINITE" -- "$ckpt" --stats "$work/good/ckpt-16.ckpt"

# A run that diverges (SGD at 1e30) and is told to go on (TerminateOnNaN would stop it) writes
# NaN with valid checksums: only --stats tells.
"$expect" 0 --match "^result: .* loss=-?nan$" -- "$mlp" --epochs 1 --samples 2048 --optimizer sgd --lr 1e30 \
  --checkpoint-dir "$work/nan" --quiet --no-terminate-on-nan >/dev/null
"$expect" 0 --match "intact" -- "$ckpt" "$work/nan"
"$expect" 1 --match "dense_0/kernel .*NON-FINITE: 4096 NaN, 0 Inf" \
  --match "troupe-ckpt: checkpoint .*ckpt-8\.ckpt: [0-9]+ of 7 tensors hold NaN or Inf" -- "$ckpt" --stats "$work/nan"

# A damaged file: a byte flipped in the middle of a tensor.
cp "$work/good/ckpt-16.ckpt" "$work/good/ckpt-20.ckpt"
printf '\xff\xff\xff\xff' | dd of="$work/good/ckpt-20.ckpt" bs=1 seek=100000 conv=notrunc status=none
"$expect" 1 --match "ckpt-20\.ckpt +(step 16, 19 variables, [0-9]+ bytes, 1 of 19 tensors fail their checksum|UNREADABLE)" \
  --match "ckpt-8\.ckpt .*intact" -- "$ckpt" "$work/good"

mkdir "$work/empty"
"$expect" 1 --match "troupe-ckpt: .*empty: no checkpoint files \(expected ckpt-<step>\.ckpt" -- "$ckpt" "$work/empty"
"$expect" 0 --match "usage: troupe-ckpt \[--stats\] PATH" --match "--stats" -- "$ckpt" --help
"$expect" 2 --match "troupe-ckpt: no PATH given" --match "--help" -- "$ckpt"
"$expect" 2 --match "troupe-ckpt: The following argument was not expected: --frobnicate" -- "$ckpt" --frobnicate
"$expect" 2 --match "troupe-ckpt: The following argument was not expected: --frobnicate" -- "$ckpt" --frobnicate x
echo "troupe-ckpt: every check passed"
