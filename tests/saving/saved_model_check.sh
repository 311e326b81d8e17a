#!/usr/bin/env bash
# Model::save in one process, nn::load_model in another: the loaded model predicts the saved bits
# and continues fit exactly as the saving process did (saved_model_program.cpp).
# Usage: saved_model_check.sh SAVED_MODEL_PROGRAM [cnn|transformer]
set -u
program="$1"
kind="${2:-cnn}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$program" save "$dir/model" "$dir" "$kind" || { echo "FAILED: the saving process exited $?"; exit 1; }
[ -f "$dir/model/model.json" ] && [ -f "$dir/model/variables.ckpt" ] ||
  { echo "FAILED: the saved directory lacks model.json or variables.ckpt"; ls -la "$dir/model"; exit 1; }
"$program" load "$dir/model" "$dir" "$kind" || { echo "FAILED: the loading process exited $?"; exit 1; }
echo "PASSED"
