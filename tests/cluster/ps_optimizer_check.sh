#!/usr/bin/env bash
# ps_trainer under troupe-launch (1 ps task, 2 workers, a chief) with each optimizer the ps tasks
# apply themselves, through Model::fit (the default) and through the hand-written closures
# (--mode closures): every closure completes and the loss of the last 10 closures is below half
# that of the first 10.
# Usage: ps_optimizer_check.sh TROUPE_LAUNCH PS_TRAINER
set -u
launch="$1"
trainer="$2"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for run in "momentum fit" "adam fit" "adamw fit" "momentum closures" "adam closures" "adamw closures"; do
  read -r optimizer mode <<< "$run"
  lr=0.05
  [ "$optimizer" = momentum ] || lr=0.01
  if ! timeout 80 "$launch" --timeout 60 --ps 1 -n 2 --chief -- "$trainer" --quiet --closures 80 \
      --optimizer "$optimizer" --lr "$lr" --mode "$mode" > "$out" 2>&1; then
    echo "FAILED ($optimizer, $mode): the cluster exited non-zero"; cat "$out"; exit 1
  fi
  line=$(grep "^\[rank 0\] result: closures=80 done=80 " "$out")
  [ -n "$line" ] || { echo "FAILED ($optimizer, $mode): no result line with 80 closures done"; cat "$out"; exit 1; }
  first=$(echo "$line" | tr ' ' '\n' | sed -n 's/^loss_first=//p')
  last=$(echo "$line" | tr ' ' '\n' | sed -n 's/^loss_last=//p')
  if ! awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 0 && l < f / 2) }'; then
    echo "FAILED ($optimizer, $mode): loss_first=$first loss_last=$last (expected the last below half the first)"; exit 1
  fi
  echo "$optimizer ($mode): loss_first=$first loss_last=$last"
done
echo PASSED
