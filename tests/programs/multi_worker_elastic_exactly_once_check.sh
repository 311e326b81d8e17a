#!/usr/bin/env bash
# Exactly-once input across changes of membership, with DATA sharding: multi_worker_trainer
# --elastic on 3 workers under troupe-launch --elastic --max-restarts 1, each worker recording the
# example ids of every training step it computes (--record-examples). Rank 2 is killed (SIGKILL)
# in the middle of epoch 2; ranks 0 and 1 roll back to their common commit and go on over 2
# workers, and a replacement joins. The global batch (256) divides the 8192 examples, so an epoch
# is one pass over a shuffle of the set: over the steps kept (a step rolled back counts only as it
# ran again), every example of every epoch is trained on once, none twice, across both changes
# (tests/programs/examples_exactly_once.py).
# Usage: multi_worker_elastic_exactly_once_check.sh TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
launch="$1"
trainer="$2"
label=exactly-once
. "$(dirname "$0")/multi_worker_lib.sh"

every_pid() { [ -n "$(pids_of 0 3 '[0-9]*')" ] && [ -n "$(pids_of 1 3 '[0-9]*')" ] && [ -n "$(pids_of 2 3 '[0-9]*')" ]; }

epochs=8
steps_per_epoch=32  # 8192 examples / a global batch of 256 (86, 85 and 85 rows on 3 workers, 128 on 2)
mkdir "$dir/examples"
start_cluster "$dir/run.out" every_pid "$launch" -n 3 --elastic --min 2 --max-restarts 1 --timeout 110 -- \
  "$trainer" --elastic --epochs "$epochs" --batch 256 --step-delay-ms 50 --record-examples "$dir/examples"

pid2=$(pids_of 2 3 '[0-9]*')
# Mid-epoch: once rank 2 has computed step 40 (the 8th of epoch 2).
at_step() { grep -q "^step=40 " "$dir/examples/worker-2-$pid2.txt" 2>/dev/null; }
wait_for 60 at_step || fail "rank 2 did not record step 40 within 60 s"
signal_rank 2 "$pid2" KILL

wait_launcher 100 ""
[ "$rc" = 0 ] || fail "the run exited $rc"
grep -q "^\[rank 0\] troupe: warning: elastic membership: $(task 2) left; 2 workers continue from step [0-9]*" "$dir/run.out" ||
  fail "rank 0 does not say that task 2 left"
grep -q "^\[rank 0\] troupe: warning: elastic membership: $(task 2) joined; 3 workers continue" "$dir/run.out" ||
  fail "no replacement joined"
same_weights 0 1 2
for r in 0 1 2; do
  [ "$(field $r membership_changes)" = 2 ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
  [ "$(field $r steps)" = $((epochs * steps_per_epoch)) ] || fail "rank $r finished at step $(field $r steps)"
done
[ "$(ls "$dir/examples" | wc -l)" = 4 ] || fail "expected 4 record files (3 workers and the replacement): $(ls "$dir/examples")"

check="$(dirname "$0")/examples_exactly_once.py"
summary=$(python3 "$check" "$dir/examples" 8192 "$steps_per_epoch" "$epochs" --across 0,1 --across 1,2) ||
  fail "$summary"
# The killed worker's steps before the loss count: without its records the check fails.
mkdir "$dir/without"
cp "$dir/examples"/worker-*.txt "$dir/without/"
rm "$dir/without/worker-2-$pid2.txt"
python3 "$check" "$dir/without" 8192 "$steps_per_epoch" "$epochs" > "$dir/without.out" &&
  fail "the check passes without the killed worker's records"
grep -q "never trained on" "$dir/without.out" || fail "the check without the killed worker's records: $(cat "$dir/without.out")"
echo "PASSED (exactly-once): task 2 killed at step 40 and replaced; $summary"
