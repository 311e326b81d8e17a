#!/usr/bin/env bash
# multi_worker_trainer --elastic under troupe-launch --elastic, a second failure while the cluster
# changes its members:
#   second-death: 4 workers, --min 2: rank 3 is killed (SIGKILL), and rank 2 a moment after the
#                 launcher saw rank 3 go, while the others re-form without it;
#   joiner-dies:  3 workers, --min 2 --max-restarts 1: rank 2 is killed, and the replacement that
#                 joins in its place is killed as soon as it is admitted (it prints its pid once the
#                 chief admitted it, while the state travels to it).
# Either way the run ends well before the launcher's timeout, never hanging, in one of the two
# clean states: the change completes without the dead workers (exit 0, ranks 0 and 1 finish in
# their own processes on 2 workers with equal weights, each naming the tasks that left), or the
# cluster falls back to the restart path, named by a survivor (non-zero, no result printed).
# Usage: multi_worker_elastic_change_failure_check.sh second-death|joiner-dies TROUPE_LAUNCH MULTI_WORKER_TRAINER
set -u
mode="$1" launch="$2" trainer="$3" label="$1"
. "$(dirname "$0")/multi_worker_lib.sh"

if [ "$mode" = second-death ]; then n=4; else n=3; fi
pid_of() { pids_of "$1" "$n" "[0-9]*"; }
every_pid() {
  local r
  for ((r = 0; r < n; ++r)); do [ -n "$(pid_of $r)" ] || return 1; done
}

args=(--elastic --epochs 6 --batch 192 --step-delay-ms 50)
if [ "$mode" = second-death ]; then
  start_cluster "$dir/run.out" every_pid "$launch" -n 4 --elastic --min 2 --timeout 110 -- "$trainer" "${args[@]}"
else
  start_cluster "$dir/run.out" every_pid "$launch" -n 3 --elastic --min 2 --max-restarts 1 --timeout 110 -- "$trainer" "${args[@]}"
fi
sleep 2
if [ "$mode" = second-death ]; then
  pid3=$(pid_of 3 | head -1)
  pid2=$(pid_of 2 | head -1)
  signal_rank 3 "$pid3" KILL
  gone3() { grep -q "^troupe-launch: worker 3 (pid $pid3, [^)]*) was killed by signal 9" "$dir/run.out"; }
  wait_for 10 gone3 || fail "the launcher did not see rank 3 killed within 10 s"
  sleep 0.2
  signal_rank 2 "$pid2" KILL
  lost=("$(task 3)" "$(task 2)")
else
  pid2=$(pid_of 2 | head -1)
  signal_rank 2 "$pid2" KILL
  joiner() { [ "$(pid_of 2 | wc -l)" -ge 2 ]; }
  wait_for 40 joiner || fail "no replacement was admitted within 40 s of the kill"
  signal_rank 2 "$(pid_of 2 | sed -n 2p)" KILL
  lost=("$(task 2)")
fi

wait_launcher 90 " of the second failure"
grep -q "restarting" "$dir/run.out" && fail "the launcher restarted the cluster"
if [ "$rc" = 0 ]; then
  for r in 0 1; do
    [ "$(pid_of $r | wc -l)" = 1 ] || fail "rank $r printed $(pid_of $r | wc -l) pid lines (survivors keep their processes)"
    [ "$(field $r workers)" = 2 ] || fail "rank $r finished with workers=$(field $r workers) (expected 2)"
    for t in "${lost[@]}"; do
      grep -q "^\[rank $r\] troupe: warning: elastic membership: .*$t.* left; " "$dir/run.out" ||
        fail "rank $r finished without saying that $t left"
    done
  done
  same_weights 0 1
  echo "PASSED ($mode): the change completed without the dead workers; ranks 0 and 1 finished on 2 workers, weights $d0"
else
  named=0
  for r in 0 1; do
    grep -q "^\[rank $r\] .*elastic membership falls back to the restart path" "$dir/run.out" && named=$((named + 1))
  done
  [ "$named" -ge 1 ] || fail "the run exited $rc and no survivor names the fallback to the restart path"
  grep -q "^\[rank [01]\] result:" "$dir/run.out" && fail "a rank printed a result after the fallback"
  echo "PASSED ($mode): the cluster fell back to the restart path, named ($named of 2), exit $rc"
fi
