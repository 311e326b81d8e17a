#!/usr/bin/env bash
# The recommender sample under troupe-launch with a chief, 2 workers and 2 ps tasks (user and item
# embeddings sharded over both): every epoch prints its held-out AUC, the last line is the result
# line, and the AUC rises clearly above chance: from about 0.5 untrained (auc_start within 0.1 of
# it) to at least 0.65 and by at least 0.1, while the mean loss falls. Measured: 0.50 untrained,
# 0.71-0.72 after the 400 steps here (0.66 after the first 100). A recommender whose updates went
# missing, to the wrong rows or to the wrong ps task stays near 0.5.
# Usage: recommender_check.sh TROUPE_LAUNCH RECOMMENDER
set -u
launch="$1"
trainer="$2"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if ! timeout 100 "$launch" --timeout 90 --ps 2 -n 2 --chief -- "$trainer" --epochs 4 --steps-per-epoch 100 > "$out" 2>&1; then
  echo "FAILED: the cluster exited non-zero"; cat "$out"; exit 1
fi
chief=$(grep '^\[rank 0\] ' "$out")
epochs=$(echo "$chief" | grep -c '^\[rank 0\] epoch [0-9]*/4: loss .* val_auc [0-9.]*$')
[ "$epochs" = 4 ] || { echo "FAILED: $epochs epoch lines with a val_auc, expected 4"; cat "$out"; exit 1; }
line=$(echo "$chief" | tail -n 1)
case "$line" in
  "[rank 0] result: epochs=4 steps=400 "*) ;;
  *) echo "FAILED: the chief's last line is not the result line of 4 epochs and 400 steps: $line"; cat "$out"; exit 1 ;;
esac
field() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
a0=$(field auc_start); a=$(field auc); lf=$(field loss_first); ll=$(field loss_last)
echo "auc_start=$a0 auc=$a loss_first=$lf loss_last=$ll"
if ! awk -v a0="$a0" -v a="$a" -v lf="$lf" -v ll="$ll" 'function abs(x) { return x < 0 ? -x : x }
    BEGIN { exit !(abs(a0 - 0.5) <= 0.1 && a >= 0.65 && a - a0 >= 0.1 && ll < lf) }'; then
  echo "FAILED: the AUC did not rise clearly above 0.5 (from $a0 to $a) or the loss did not fall ($lf to $ll)"
  cat "$out"; exit 1
fi
echo PASSED
