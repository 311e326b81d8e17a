#!/usr/bin/env bash
# multi_worker_trainer --elastic on 3 workers under troupe-launch --elastic --max-restarts 1:
# rank 2 is killed (SIGKILL) mid-run, ranks 0 and 1 shrink to 2 workers, the launcher starts a
# replacement (TROUPE_JOIN=1, rank 2's TF_CONFIG) and it joins the running cluster at a step
# boundary: it receives the committed state by broadcast over the ring, and every worker finishes
# on 3 workers with the same weights digest, ranks 0 and 1 in the processes they started in.
# Meanwhile, while the chief still runs, a stranger with another TROUPE_CLUSTER_TOKEN asks to join
# and is refused, and so is a worker with the token asking to join as a fourth (max_workers is 3).
# A port taken between its pick and the chief's bind starts the run again on fresh ports.
# Usage: multi_worker_elastic_join_check.sh TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
launch="$1"
trainer="$2"
label=join
. "$(dirname "$0")/multi_worker_lib.sh"
. "$(dirname "$0")/../lib/cluster_common.sh"

every_pid() { [ -n "$(pids_of 0 3 '[0-9]*')" ] && [ -n "$(pids_of 1 3 '[0-9]*')" ] && [ -n "$(pids_of 2 3 '[0-9]*')" ]; }

# ask NAME SECONDS TOKEN INDEX WORKERS START_MS: a worker of the cluster WORKERS (its addresses,
# quoted) with index INDEX and TROUPE_CLUSTER_TOKEN TOKEN asks to join it (TROUPE_START_TIMEOUT_MS
# START_MS), bounded by SECONDS; its output in $dir/NAME.out, its status in $asked (124: out of time).
ask() {
  local name="$1" seconds="$2" token="$3" index="$4" workers="$5" start_ms="$6"
  TF_CONFIG="{\"cluster\": {\"worker\": [$workers]}, \"task\": {\"type\": \"worker\", \"index\": $index}}" \
    TROUPE_CLUSTER_TOKEN="$token" TROUPE_ELASTIC=1 TROUPE_JOIN=1 TROUPE_START_TIMEOUT_MS="$start_ms" \
    timeout "$seconds" "$trainer" --elastic --epochs 6 --batch 192 > "$dir/$name.out" 2>&1 &
  local pid=$!
  track "$pid"
  wait "$pid"
  asked=$?
  untrack "$pid"
}

# taken: a port picked free was taken before it was bound: the chief says it cannot listen (and
# the launcher ends the run), or the launcher finds a --port-base port in use.
taken() { grep -q 'cannot listen\|is in use (--port-base' "$dir/run.out" 2>/dev/null; }
formed_or_taken() { every_pid || taken || ! kill -0 "$launcher_pid" 2>/dev/null; }

# Four free consecutive ports (the cluster's three and the fourth worker's), so that the stranger
# knows the chief's address. Another process may take one between the pick and the bind: then the
# run starts again on fresh ports (cluster_common.sh's rule), up to 3 times.
# 42 steps an epoch, global batch 192 (64 rows a worker, 96 on 2, 64 again on 3): about 18 s.
for attempt in 1 2 3; do
  base=$(consecutive_ports 4) || fail "no four free consecutive ports"
  start_launcher "$dir/run.out" env TROUPE_CLUSTER_TOKEN=the-cluster-token "$launch" -n 3 --port-base "$base" \
    --elastic --min 2 --max-restarts 1 --timeout 110 -- "$trainer" --elastic --epochs 8 --batch 192 --step-delay-ms 50
  wait_for 30 formed_or_taken
  taken || break
  echo "a port was taken (attempt $attempt): $(grep -h -m 1 'cannot listen\|is in use (--port-base' "$dir/run.out")"
  kill -TERM "$launcher_pid" 2>/dev/null
  wait_launcher 30 " after a port was taken"
  [ "$attempt" = 3 ] && fail "no free ports after 3 tries"
done
every_pid || fail "the workers did not print their pids within 30 s"
pid0=$(pids_of 0 3 '[0-9]*')
pid2=$(pids_of 2 3 '[0-9]*')
[ -n "$pid0" ] && [ -n "$pid2" ] || fail "the workers did not print their pids within 30 s"
sleep 2
signal_rank 2 "$pid2" KILL

joined="elastic membership: $(task 2) joined; 3 workers continue from step [0-9]* as ring generation 2 (paused [0-9]* ms, state [0-9]* bytes)$"
wait_for 30 grep -q "^\[rank 0\] troupe: warning: $joined" "$dir/run.out" || fail "no replacement joined within 30 s of the kill"

# The stranger: the cluster's address, another token.
cluster="\"127.0.0.1:$base\", \"127.0.0.1:$((base + 1))\", \"127.0.0.1:$((base + 2))\""
ask stranger 30 not-the-token 2 "$cluster" 2000
[ "$asked" != 0 ] && [ "$asked" != 124 ] || fail "the stranger exited $asked (expected a refusal, non-zero)"
grep -q "could not reach the chief .*TROUPE_CLUSTER_TOKEN" "$dir/stranger.out" || fail "the stranger's error does not name the token"
kill -0 "$pid0" 2>/dev/null || fail "the chief ended before the stranger was refused (the refusal proves nothing)"

# A fourth worker, with the token: the chief refuses it at its next step boundary, naming max_workers.
four="$cluster, \"127.0.0.1:$((base + 3))\""
ask fourth 40 the-cluster-token 3 "$four" 20000
[ "$asked" != 0 ] && [ "$asked" != 124 ] || fail "the fourth worker exited $asked (expected a refusal, non-zero)"
grep -q "elastic membership: refused the join of $(task 3): the cluster has 3 workers, max_workers (3)" "$dir/fourth.out" ||
  fail "the fourth worker was not refused naming max_workers"
kill -0 "$pid0" 2>/dev/null || fail "the chief ended before it refused the fourth worker"

wait_launcher 90 ""
[ "$rc" = 0 ] || fail "the run exited $rc"
grep -q "^troupe-launch: starting a replacement for worker 2 (1 of 1); it joins the running cluster$" "$dir/run.out" ||
  fail "the launcher did not start a replacement"
grep -q "restarting" "$dir/run.out" && fail "the launcher restarted the cluster"
grep -q "^\[rank 2\] troupe: warning: elastic membership: joined as worker 2 of 3 at step [0-9]* (state [0-9]* bytes, received in [0-9]* ms)$" \
  "$dir/run.out" || fail "the replacement does not say it joined"
for r in 0 1; do
  [ "$(pids_of $r 3 '[0-9]*' | wc -l)" = 1 ] || fail "rank $r printed $(pids_of $r 3 '[0-9]*' | wc -l) pid lines (survivors keep their processes)"
  grep -q "^\[rank $r\] troupe: warning: elastic membership: $(task 2) left; 2 workers continue" "$dir/run.out" ||
    fail "rank $r does not say that task 2 left"
  grep -q "^\[rank $r\] troupe: warning: $joined" "$dir/run.out" || fail "rank $r does not say that task 2 joined"
done
[ "$(pids_of 2 3 '[0-9]*' | wc -l)" = 2 ] || fail "rank 2 printed $(pids_of 2 3 '[0-9]*' | wc -l) pid lines (expected the first and the replacement)"
same_weights 0 1 2
for r in 0 1 2; do
  [ "$(field $r workers)" = 3 ] || fail "rank $r finished with workers=$(field $r workers) (expected 3)"
  [ "$(field $r membership_changes)" = 2 ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
  [ "$(field $r steps)" = 336 ] || fail "rank $r finished at step $(field $r steps) (expected 336)"
done
acc=$(field 0 accuracy)
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "accuracy $acc after the changes (expected >= 0.9)"
pause=$(sed -n "s/^\[rank 0\] troupe: warning: elastic membership: .* joined; .*(paused \([0-9]*\) ms.*/\1/p" "$dir/run.out")
echo "PASSED (join): task 2 killed, a replacement joined (the chief paused $pause ms), 3 workers finished with weights $d0; the stranger and a fourth were refused"
