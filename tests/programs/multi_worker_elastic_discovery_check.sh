#!/usr/bin/env bash
# troupe-launch --elastic --host-discovery-script with multi_worker_trainer --elastic: the script
# prints the hosts file the test rewrites while training runs.
#   grow:   it lists localhost:2, then localhost:3: the launcher starts worker 2, which joins the
#           running cluster; all three finish with one weights digest, ranks 0 and 1 in the
#           processes they started in.
#   shrink: three workers, the list goes from 127.0.0.1:3 to 127.0.0.1:2: the launcher asks
#           worker 2 to leave (SIGUSR2); it leaves at a step boundary and exits 0, the others go on
#           from that step without a rollback (every step of the records ran once, and every
#           example of every epoch was trained on once: --record-examples) and finish with one
#           digest; the removal is no failure. The chief asked to leave (SIGUSR2), and rank 1
#           asked at min_workers, are refused, named, and train on.
#   bad:    the script prints a malformed line, then hangs (past --discovery-timeout), then the
#           list again: each is named in the launcher's output, nothing changes, and the two
#           workers finish; the hanging script leaves nothing behind.
# Usage: multi_worker_elastic_discovery_check.sh MODE TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
mode="$1"
launch="$2"
trainer="$3"
label="discovery $mode"
. "$(dirname "$0")/multi_worker_lib.sh"

# The script: prints $dir/hosts, or hangs while $dir/hang exists (in a sleep it started, whose pid
# it adds to $dir/sleeps, so that the test can check that none is left behind).
cat > "$dir/discover.sh" <<SCRIPT
#!/bin/sh
if [ -e "$dir/hang" ]; then sleep 300 & echo \$! >> "$dir/sleeps"; wait; fi
cat "$dir/hosts"
SCRIPT
chmod +x "$dir/discover.sh"
hosts() { printf '%b' "$1" > "$dir/hosts.tmp" && mv "$dir/hosts.tmp" "$dir/hosts"; }

# formed: each of the $n workers the run started with printed its pid.
formed() {
  local r
  for ((r = 0; r < n; ++r)); do [ -n "$(pids_of $r "$n")" ] || return 1; done
}
# run N HOSTS [ARGS...]: the launcher with N workers, the script listing HOSTS first, until they
# formed the cluster (start_cluster: again on fresh ports when one stayed taken); 42 steps an
# epoch at global batch $batch (192), 8 epochs, 50 ms a step: about 20 s. ARGS go to the trainer.
run() {
  n="$1"
  hosts "$2"
  start_cluster "$dir/run.out" formed "$launch" -n "$1" --elastic --min 2 --max 3 --host-discovery-script "$dir/discover.sh" \
    --discovery-interval 0.2 --discovery-timeout 1 --leave-timeout 20 --timeout 110 -- \
    "$trainer" --elastic --epochs 8 --batch "${batch:-192}" --step-delay-ms 50 "${@:3}"
}
launcher_says() { grep -q "^troupe-launch: $1" "$dir/run.out"; }
steps_done() { grep -q "^\[rank 0\] .*Epoch 2/" "$dir/run.out"; }

case "$mode" in
  grow)
    run 2 'localhost:2\n'
    wait_for 30 steps_done || fail "the first epoch did not end within 30 s"
    hosts '# one more slot\nlocalhost:3\n'
    wait_for 30 launcher_says "host discovery: starting worker 2 on 127.0.0.1 (127.0.0.1:[0-9]*); it joins the running cluster$" ||
      fail "the launcher did not start worker 2 within 30 s of the third slot"
    joined="elastic membership: $(task 2) joined; 3 workers continue from step [0-9]* as ring generation 1 (paused [0-9]* ms, state [0-9]* bytes)$"
    wait_for 30 grep -q "^\[rank 0\] troupe: warning: $joined" "$dir/run.out" || fail "worker 2 did not join within 30 s"
    wait_launcher 90 ""
    [ "$rc" = 0 ] || fail "the run exited $rc"
    launcher_says "host discovery: the hosts are now 127.0.0.1:3 (3 slots): removing 0, adding 1 worker$" ||
      fail "the launcher does not name the new list"
    grep -q "^\[rank 2\] troupe: warning: elastic membership: joined as worker 2 of 3 at step [0-9]* " "$dir/run.out" ||
      fail "worker 2 does not say it joined"
    for r in 0 1; do
      [ "$(pids_of $r '[23]' | wc -l)" = 1 ] || fail "rank $r printed $(pids_of $r '[23]' | wc -l) pid lines (it keeps its process)"
      grep -q "^\[rank $r\] troupe: warning: $joined" "$dir/run.out" || fail "rank $r does not say that task 2 joined"
    done
    same_weights 0 1 2
    for r in 0 1 2; do
      [ "$(field $r workers)" = 3 ] || fail "rank $r finished with workers=$(field $r workers) (expected 3)"
      [ "$(field $r membership_changes)" = 1 ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
      [ "$(field $r steps)" = 336 ] || fail "rank $r finished at step $(field $r steps) (expected 336)"
    done
    echo "PASSED (discovery grow): worker 2 added at the third slot joined; 3 workers finished with weights $d0"
    ;;
  shrink)
    # 32 steps an epoch at global batch 256, which divides the 8192 examples (one pass an epoch).
    mkdir "$dir/examples"
    batch=256
    run 3 '127.0.0.1:3\n' --record-examples "$dir/examples"
    wait_for 30 steps_done || fail "the first epoch did not end within 30 s"
    # The chief asked to leave is refused (it holds the membership) and trains on.
    kill -USR2 "$(pids_of 0 3)"
    refused="troupe: warning: elastic membership: this worker asked to leave and the chief refused"
    wait_for 30 grep -q "^\[rank 0\] $refused ($(task 0) is the chief, which holds the cluster's membership); it trains on$" "$dir/run.out" ||
      fail "the chief's own leave was not refused within 30 s"
    hosts '127.0.0.1:2\n'
    wait_for 30 launcher_says "worker 2 (pid [0-9]*, 127.0.0.1:[0-9]*) left (exited with status 0), removed by host discovery; not a failure$" ||
      fail "worker 2 did not leave (exit 0) within 30 s"
    # At min_workers (2), rank 1 asked to leave is refused and trains on.
    kill -USR2 "$(pids_of 1 3)"
    wait_for 30 grep -q "^\[rank 1\] $refused ($(task 1) would leave 1 worker(s), fewer than min_workers (2)); it trains on$" "$dir/run.out" ||
      fail "rank 1's leave below min_workers was not refused within 30 s"
    wait_launcher 90 ""
    [ "$rc" = 0 ] || fail "the run exited $rc"
    launcher_says "host discovery: the hosts are now 127.0.0.1:2 (2 slots): removing 1, adding 0 workers$" ||
      fail "the launcher does not name the new list"
    launcher_says "removing worker 2 (pid [0-9]*, 127.0.0.1:[0-9]*) from 127.0.0.1: asking it to leave (SIGUSR2; SIGKILL after 20 s); the others go on without it from its next step boundary$" ||
      fail "the launcher does not say it asks worker 2 to leave"
    grep -q "did not leave within\|starting a replacement\|restarting\|stopping the others" "$dir/run.out" &&
      fail "the removal was taken for a failure"
    grep -q "^\[rank 2\] result:" "$dir/run.out" && fail "the worker that left printed a result"
    # It left at a step boundary, and the others went on from that step: no rollback.
    left_at=$(field 2 step "" left)
    [ -n "$left_at" ] || fail "worker 2 does not print the step it left at"
    grep -q "^\[rank 2\] troupe: warning: elastic membership: this worker left the cluster at step $left_at as it was asked to; 2 workers continue" "$dir/run.out" ||
      fail "worker 2 does not say it left at step $left_at"
    for r in 0 1; do
      [ "$(pids_of $r 3 | wc -l)" = 1 ] || fail "rank $r printed $(pids_of $r 3 | wc -l) pid lines (it keeps its process)"
      grep -q "^\[rank $r\] troupe: warning: elastic membership: $(task 2) left (asked to leave); 2 workers continue from step $left_at as ring generation 1 (paused [0-9]* ms, nothing rolled back)$" "$dir/run.out" ||
        fail "rank $r does not say that task 2 left at step $left_at with nothing rolled back"
    done
    grep -q "elastic membership: $(task 2) left; \|falls back" "$dir/run.out" && fail "the leave was taken for a loss"
    same_weights 0 1
    for r in 0 1; do
      [ "$(field $r workers)" = 2 ] || fail "rank $r finished with workers=$(field $r workers) (expected 2)"
      [ "$(field $r membership_changes)" = 1 ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
      [ "$(field $r steps)" = 256 ] || fail "rank $r finished at step $(field $r steps) (expected 256)"
    done
    summary=$(python3 "$(dirname "$0")/examples_exactly_once.py" "$dir/examples" 8192 32 8 --across 0,1 --no-rollback) ||
      fail "$summary"
    echo "PASSED (discovery shrink): worker 2 asked to leave left at step $left_at (exit 0), no step ran twice; 2 workers finished with weights $d0; $summary"
    ;;
  bad)
    run 2 'localhost:2\n'
    hosts 'localhost:2\nlocalhost:lots\n'
    wait_for 10 launcher_says "host discovery: '$dir/discover.sh' printed a bad list, line 2 ('localhost:lots'): expected host:slots with slots 1..256; the workers stay as they are$" ||
      fail "the malformed line was not named within 10 s"
    hosts 'localhost:2\nnode7.example:1\n'
    wait_for 10 launcher_says "host discovery: '$dir/discover.sh' printed a bad list, line 2 ('node7.example:1'): 'node7.example' is not this machine" ||
      fail "the remote host was not refused within 10 s"
    touch "$dir/hang"
    wait_for 10 launcher_says "host discovery: '$dir/discover.sh' did not finish within 1 s (--discovery-timeout); killed it (SIGKILL); the workers stay as they are$" ||
      fail "the hanging script was not named within 10 s"
    hosts 'localhost:2\n'
    rm -f "$dir/hang"
    wait_for 10 launcher_says "host discovery: '$dir/discover.sh' lists usable hosts again$" || fail "the script's recovery was not said within 10 s"
    kill -0 "$launcher_pid" 2>/dev/null || fail "the run ended before the script recovered (the checks prove nothing)"
    wait_launcher 90 ""
    [ "$rc" = 0 ] || fail "the run exited $rc"
    [ -s "$dir/sleeps" ] || fail "the hanging script did not start its sleep"
    while read -r p; do kill -0 "$p" 2>/dev/null && fail "the hanging script's sleep (pid $p) was left running"; done < "$dir/sleeps"
    grep -q "^troupe-launch: host discovery: starting\|^troupe-launch: removing" "$dir/run.out" && fail "a bad list changed the workers"
    same_weights 0 1
    for r in 0 1; do
      [ "$(field $r workers)" = 2 ] || fail "rank $r finished with workers=$(field $r workers) (expected 2)"
      [ "$(field $r membership_changes)" = 0 ] || fail "rank $r has membership_changes=$(field $r membership_changes)"
    done
    echo "PASSED (discovery bad): a malformed line, a remote host and a hanging script named; 2 workers finished with weights $d0"
    ;;
  *) fail "unknown mode '$mode'" ;;
esac
