#!/usr/bin/env bash
# mlp_classifier --tensorboard-dir, read back by TensorBoard's own reader (the tensorboard package
# from PyPI, which tools/install-deps.sh installs into $TROUPE_TENSORBOARD_VENV, default
# /opt/troupe-tensorboard): every scalar is where TensorBoard looks and has the value printed.
# Usage: tensorboard_check.sh MLP_CLASSIFIER READER_PY
set -u
mlp="$1"
reader="$2"
venv="${TROUPE_TENSORBOARD_VENV:-/opt/troupe-tensorboard}"
python="$venv/bin/python"
if ! "$python" -c "import tensorboard" 2>/dev/null; then
  echo "FAILED: no tensorboard package in $venv: run tools/install-deps.sh (or set TROUPE_TENSORBOARD_VENV)"
  exit 1
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
timeout 120 "$mlp" --samples 2048 --batch 256 --replicas 2 --hidden 32 --epochs 3 --lr 0.004 \
  --validation-split 0.25 --tensorboard-dir "$dir/logs" > "$dir/out" 2>&1
rc=$?
[ "$rc" = 0 ] || { echo "FAILED: mlp_classifier exited $rc"; cat "$dir/out"; exit 1; }
timeout 120 "$python" "$reader" "$dir/logs" "$dir/out" || { cat "$dir/out"; exit 1; }
