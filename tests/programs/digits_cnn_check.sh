#!/usr/bin/env bash
# digits_cnn on scikit-learn's digits (tools/install-deps.sh puts them at /opt/troupe-data), checked
# on its exit status and its result lines:
# - under MirroredStrategy on 2 CPU replicas it exits 0 with --min-accuracy 0.97 (the program
#   checks the threshold) and reports a test accuracy of at least 0.97 over the whole held-out set;
# - as 2 workers started by troupe-launch (MultiWorkerMirroredStrategy, real processes) both
#   exit 0, both report the same accuracy and loss, at least 0.97, over the whole test set once
#   each (Model::evaluate gives every worker the same result), and the same predictions
#   (Model::predict: their digest), whose accuracy is evaluate's;
# - --save writes the model (model.json and variables.ckpt), under 2 workers too (the chief
#   writes, nothing is left beside it).
# Usage: digits_cnn_check.sh TROUPE_LAUNCH DIGITS_CNN EPOCHS
set -u
launch="$1"
cnn="$2"
epochs="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.out; do echo "--- $f"; cat "$f"; done
  exit 1
}

# field KEY LINE: the value of KEY= on LINE.
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
at_least() { python3 -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)"; }

test_samples=$(python3 -c "n = sum(1 for l in open('/opt/troupe-data/digits.csv') if l.strip()); print(max(1, int(n * 0.2)))")

"$cnn" --replicas 2 --epochs "$epochs" --min-accuracy 0.97 --quiet --save "$dir/model" > "$dir/mirrored.out" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "the MirroredStrategy run exited $rc"
line=$(grep "^result: workers=1 replicas=2 " "$dir/mirrored.out")
[ -n "$line" ] || fail "the MirroredStrategy run printed no result line"
acc=$(field test_accuracy "$line")
at_least "$acc" 0.97 || fail "MirroredStrategy: test accuracy $acc < 0.97"
[ "$(field test_samples "$line")" = "$test_samples" ] || fail "MirroredStrategy: evaluated $(field test_samples "$line") images, not the $test_samples held out"
[ "$(field predict_accuracy "$line")" = "$acc" ] || fail "MirroredStrategy: predict's accuracy $(field predict_accuracy "$line") is not evaluate's $acc"
[ -f "$dir/model/model.json" ] && [ -f "$dir/model/variables.ckpt" ] || fail "--save wrote no model"

"$launch" -n 2 --timeout 120 -- "$cnn" --multi-worker --epochs "$epochs" --min-accuracy 0.97 --quiet \
  --save "$dir/saves/model" > "$dir/workers.out" 2>&1
rc=$?
[ "$rc" = 0 ] || fail "the 2-worker run exited $rc"
for r in 0 1; do
  line=$(grep "^\[rank $r\] result: workers=2 replicas=2 " "$dir/workers.out")
  [ -n "$line" ] || fail "rank $r printed no result line with workers=2 replicas=2"
  eval "acc$r=$(field test_accuracy "$line") loss$r=$(field test_loss "$line") samples$r=$(field test_samples "$line")"
  eval "pacc$r=$(field predict_accuracy "$line") digest$r=$(field predictions_digest "$line")"
done
at_least "$acc0" 0.97 || fail "2 workers: test accuracy $acc0 < 0.97"
[ "$acc0" = "$acc1" ] && [ "$loss0" = "$loss1" ] || fail "the workers' results differ: $acc0/$loss0 and $acc1/$loss1"
[ "$samples0" = "$test_samples" ] && [ "$samples1" = "$test_samples" ] ||
  fail "the workers evaluated $samples0 and $samples1 images, not the $test_samples held out once each"
[ "$pacc0" = "$acc0" ] && [ "$pacc1" = "$acc1" ] || fail "2 workers: predict's accuracy $pacc0/$pacc1 is not evaluate's $acc0"
[ -n "$digest0" ] && [ "$digest0" = "$digest1" ] || fail "the workers' predictions differ: digests $digest0 and $digest1"
[ -f "$dir/saves/model/model.json" ] && [ -f "$dir/saves/model/variables.ckpt" ] || fail "2 workers: --save wrote no model"
[ "$(ls "$dir/saves")" = model ] || fail "2 workers: --save left $(ls "$dir/saves" | tr '\n' ' ')beside the model"
echo "PASSED MirroredStrategy: test accuracy $acc; 2 workers: $acc0 on both ranks ($test_samples test images)"
