#!/usr/bin/env bash
# Clusters of tasks as real processes on loopback (or two network-namespace "hosts"): a chief with
# ClusterCoordinator, workers and a ps task, each bounded in time and killed on exit.
#   run_cluster.sh SCENARIO BUILD_DIR
# Scenarios:
#   train          ps_trainer's hand-written closures (--mode closures), 1 chief + 2 workers + 1 ps:
#                  every closure done, the loss falls, all exit 0
#   worker-killed  ps_trainer's Model::fit (its default) with worker 1 killed by SIGKILL mid-run:
#                  every closure done, workers_lost=1
#   ps-killed      the ps task killed mid-run: the chief fails within 2 s naming it; the workers end
#   worker-stopped worker 1 SIGSTOPped mid-run (its connection stays open): its heartbeats stop, it
#                  is lost, every closure is done, workers_lost=1; SIGCONT then lets it end
#   worker-resumed worker 1 SIGSTOPped, lost, then SIGCONTed: it is taken back and runs closures
#                  again; every closure is done, workers_lost=1
#   ps-stopped     the ps task SIGSTOPped mid-run: the chief fails within 5 s naming it; after
#                  SIGCONT every task ends (nothing hangs)
#   chief-stopped  the chief SIGSTOPped mid-run: every task hears no heartbeat, names the chief lost
#                  and ends within 10 s
#   leave-early    a chief leaves before it reached a worker that came up late: it tells the worker,
#                  which ends at once (not after its start timeout)
#   daemons        troupe-worker daemons with a module: results, a failing and a missing function
#                  named, variables (also made in the strategy's scope), per-worker iterators;
#                  SIGTERM stops each daemon cleanly
#   cancel         a function raises: join, schedule and done raise it once each, after the
#                  functions in flight finished; the functions still queued are cancelled, on the
#                  chief and on the workers (those handed ahead within closures_per_worker)
#   heartbeat      the chief's heartbeats set to 200 ms x 8: worker 1 SIGSTOPped for 2.7 s (less
#                  than the default 6 x 500 ms) is lost and taken back; every closure is done
#   two-hosts      ps_trainer with its tasks in two network namespaces, over mutual TLS
#   no-chief       a worker of ps_trainer whose chief never comes fails after the start timeout
#   bulk           daemons with 2 ps tasks: variables of odd sizes and every dtype read and updated
#                  bit-exact over the data connections, no torn shard under concurrent reads and
#                  whole assigns, while strangers hit a ps task's data port (junk, a segment table
#                  claiming 16 GiB, silence): refused and logged, the ps task stays small; ps task 1
#                  serves its data on the fixed port --data-port gives it
#   stall          the chief's stall bounds set to 1 s and 3 s: a 2 s closure is reported and
#                  cleared; a closure stuck on one worker is given up past 3 s and runs on the
#                  other; one that hangs on both fails join(), naming both
#   ps-checkpoint  daemons with 2 ps tasks: the chief saves sharded checkpoints of 32 MiB over and
#                  over and is SIGKILLed the moment one of them has begun; the interrupted save
#                  left no manifest, troupe-ckpt lists the whole ones as intact, and a new chief
#                  (on fresh daemons) restores the newest with every element intact and removes
#                  the interrupted one; troupe-ckpt names a damaged and a missing shard file
#   (the scenarios of strangers, impostors and tokens: stranger_scenarios.sh)
set -uo pipefail
scenario="$1"
build="$2"
trainer="$build/examples/ps_trainer"
daemon="$build/tools/troupe-worker"
chief_bin="$build/tests/cluster/cluster_chief"
module="$build/tests/cluster/libtroupe_cluster_functions.so"
dir="$(mktemp -d)"
pids=()
source "$(dirname "$0")/../lib/cluster_common.sh"
# Every task runs under timeout, which makes itself the leader of a process group of its own: the
# whole group goes, so that no task outlives the scenario. timeout -k: a task that ignores or
# hangs on the SIGTERM (troupe-worker stops cleanly on it) is killed 5 s later, so no wait on a
# task outlasts its bound.
cleanup() {
  kill_tasks
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $scenario: $*"
  for f in "$dir"/*.log; do echo "--- $(basename "$f")"; tail -n 40 "$f"; done
  exit 1
}

# Six free loopback ports (free when asked: another process may take one before a task binds it;
# start_listening starts the tasks again on fresh ports then).
pick_ports() { read -r p0 p1 p2 p3 p4 p5 <<< "$(free_ports 6)"; }
pick_ports
host=127.0.0.1
nps=1  # ps tasks: 1 on p2, or 2 on p2 and p4
cluster() {
  local ps="\"$host:$p2\""
  [[ $nps == 2 ]] && ps+=", \"$host:$p4\""
  echo "{\"chief\": [\"$host:$p3\"], \"worker\": [\"$host:$p0\", \"$host:$p1\"], \"ps\": [$ps]}"
}
tf_config() { echo "{\"cluster\": $(cluster), \"task\": {\"type\": \"$1\", \"index\": $2}}"; }
# task_of NAME: the task a name stands for and the port it listens on ("worker 1 PORT").
task_of() {
  case "$1" in
    w0) echo "worker 0 $p0" ;;
    w1) echo "worker 1 $p1" ;;
    ps) echo "ps 0 $p2" ;;
    ps1) echo "ps 1 $p4" ;;
    *) fail "no task named $1" ;;
  esac
}

# start NAME TYPE INDEX COMMAND...: runs COMMAND with that task's TF_CONFIG in the background.
start() {
  local name="$1" type="$2" index="$3"
  shift 3
  : >"$dir/$name.log"  # emptied now: a check right after must not read an earlier start's lines
  TF_CONFIG="$(tf_config "$type" "$index")" timeout -k 5 60 "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
# wait_for FILE REGEX SECONDS
wait_for() { wait_for_line "$1" "$2" "$3" -E || fail "no line matching '$2' in $(basename "$1") within $3 s"; }
# timed_out STATUS: the task ran into the timeout it runs under (124), or ignored its SIGTERM and
# was killed 5 s later (137).
timed_out() { [[ "$1" == 124 || "$1" == 137 ]]; }
result_field() { grep -Eo "$2=[0-9.e+-]+" "$1" | tail -n 1 | cut -d= -f2; }

check_training() {  # LOG CLOSURES WORKERS_LOST
  local log="$1"
  grep -q '^result: ' "$log" || fail "no result line"
  [[ "$(grep -c '^result: ' "$log")" == 1 ]] || fail "more than one result line"
  [[ "$(result_field "$log" closures)" == "$2" ]] || fail "closures is not $2"
  [[ "$(result_field "$log" done)" == "$2" ]] || fail "done is not $2: not every closure completed once"
  [[ "$(result_field "$log" workers_lost)" == "$3" ]] || fail "workers_lost is not $3"
  # The loss fell from where training started: the first 10 closures' loss, or the initial
  # weights' loss on the first batch (ps_trainer --mode local --closures 1) when that is higher.
  # Closures are asynchronous: a worker slow to start (a loaded machine) runs its first closures
  # on weights the other worker already trained, so their loss alone can start low.
  [[ -n "${initial_loss:-}" ]] ||
    initial_loss=$("$trainer" --mode local --quiet --closures 1 | tr ' ' '\n' | sed -n 's/^loss_first=//p')
  python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(0 if c < 0.6 * max(a, b) else 1)" \
    "$initial_loss" "$(result_field "$log" loss_first)" "$(result_field "$log" loss_last)" ||
    fail "the loss did not fall (from $(result_field "$log" loss_first), or $initial_loss at the start, to" \
         "$(result_field "$log" loss_last))"
  [[ "$(grep -c 'closures' "$log")" -ge $(($2 / 10)) ]] || fail "fewer progress lines than one per 10 closures"
}

# A ps_trainer task with the arguments in task_args, ready once it listens on its port.
task_args=()
launch_task() {
  local t
  read -r -a t <<< "$(task_of "$1")"
  start "$1" "${t[0]}" "${t[1]}" "$trainer" "${task_args[@]}"
}
task_listens() {
  local t p
  read -r -a t <<< "$(task_of "$1")"
  eval "p=\$pid_$1"
  listens "$p" "${t[2]}"
}
# start_tasks ARGS...: ps_trainer's workers and ps task with ARGS, listening, before their chief.
start_tasks() {
  task_args=("$@")
  start_listening task_listens launch_task w0 w1 ps
}
# A troupe-worker daemon with the test module (and the token in token_NAME, where one is set; a
# fixed data port from the port variable that dport_NAME names, where one is), ready once it says so.
launch_daemon() {
  local t tok dport
  read -r -a t <<< "$(task_of "$1")"
  eval "tok=\${token_$1:-}"
  eval "dport=\${dport_$1:-}"
  [[ -n "$dport" ]] && eval "dport=\$$dport"
  timeout -k 5 60 env ${tok:+TROUPE_CLUSTER_TOKEN="$tok"} "$daemon" --task "${t[0]}:${t[1]}" --cluster "$(cluster)" \
    --module "$module" ${dport:+--data-port "$dport"} >"$dir/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
}
daemon_ready() { grep -q '^troupe-worker: ready ' "$dir/$1.log" 2>/dev/null; }
# start_daemons [NAME...]: the daemons NAME (w0, w1 and ps unless named), all ready.
start_daemons() {
  [[ $# -gt 0 ]] || set -- w0 w1 ps
  start_listening daemon_ready launch_daemon "$@"
  for n in "$@"; do daemon_ready "$n" || fail "$n ended before it was ready"; done
}
# stop_daemons: SIGTERM to each daemon, which must exit 0.
stop_daemons() {
  for n in w0 w1 ps; do
    eval "p=\$pid_$n"
    term_task "$p"
    status_of "$p"
    [[ "$st" == 0 ]] || fail "$n exited $st on SIGTERM (expected 0)"
  done
}

case "$scenario" in
  train)
    start_tasks --closures 200
    start chief chief 0 "$trainer" --closures 200 --mode closures --optimizer sgd
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief did not exit 0"
    check_training "$dir/chief.log" 200 0
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"; [[ $st == 0 ]] || fail "$n did not exit 0 after its chief left"
    done
    ;;
  worker-killed)
    start_tasks --closures 200 --step-delay-ms 10
    start chief chief 0 "$trainer" --closures 200 --step-delay-ms 10
    wait_for "$dir/chief.log" '^closures [0-9]+/200' 30
    pkill -KILL -P "$pid_w1"  # the worker itself, not the timeout that runs it
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief did not exit 0 after losing a worker"
    check_training "$dir/chief.log" 200 1
    grep -q "lost /job:worker/replica:0/task:1" "$dir/chief.log" || fail "the chief did not log the lost worker"
    status_of "$pid_w0"; [[ $st == 0 ]] || fail "worker 0 did not exit 0"
    status_of "$pid_ps"; [[ $st == 0 ]] || fail "the ps task did not exit 0"
    ;;
  ps-killed)
    start_tasks --closures 2000 --step-delay-ms 5
    start chief chief 0 "$trainer" --closures 2000 --step-delay-ms 5
    wait_for "$dir/chief.log" '^closures [0-9]+/2000' 30
    # Mid-run: both workers serve the chief (a worker still starting when the chief fails is
    # leave-early's case).
    for w in 0 1; do wait_for "$dir/chief.log" "connected /job:worker/replica:0/task:$w " 30; done
    killed=$(date +%s%N)
    pkill -KILL -P "$pid_ps"
    status_of "$pid_chief"
    ms=$((($(date +%s%N) - killed) / 1000000))
    [[ "$st" != 0 ]] && ! timed_out "$st" || fail "the chief exited $st (expected a failure of its own, not 0 or a timeout)"
    grep -q "/job:ps/replica:0/task:0" "$dir/chief.log" || fail "the chief's error does not name the ps task"
    [[ $ms -le 2000 ]] || fail "the chief took $ms ms to fail after the ps task died (at most 2000)"
    echo "the chief failed $ms ms after the ps task was killed: $(grep 'ps_trainer:' "$dir/chief.log" | tail -n 1)"
    for n in w0 w1; do
      eval "p=\$pid_$n"
      status_of "$p"
      ! timed_out "$st" || fail "$n hung after its chief failed"
      [[ "$st" == 0 ]] || fail "$n exited $st after its chief failed (expected 0)"
      grep -Eq "(left|lost) /job:chief/replica:0/task:0" "$dir/$n.log" || fail "$n did not log its chief going"
    done
    ;;
  worker-stopped)
    start_tasks --closures 200 --step-delay-ms 10
    start chief chief 0 "$trainer" --closures 200 --step-delay-ms 10
    wait_for "$dir/chief.log" '^closures [0-9]+/200' 30
    wait_for "$dir/chief.log" "connected /job:worker/replica:0/task:1 " 30
    stopped=$(pgrep -P "$pid_w1")  # the worker itself, not the timeout that runs it
    [[ -n "$stopped" ]] || fail "no worker 1 process to stop"
    kill -STOP "$stopped"
    # Bounded: a chief that never names the silent worker fails here, not at its own timeout.
    wait_for "$dir/chief.log" "lost /job:worker/replica:0/task:1 \\(it missed" 20
    status_of "$pid_chief"
    kill -CONT "$stopped"
    [[ $st == 0 ]] || fail "the chief exited $st after a worker stopped answering (expected 0)"
    check_training "$dir/chief.log" 200 1
    grep -q "lost /job:worker/replica:0/task:1 (it missed 6 heartbeats of 500 ms" "$dir/chief.log" ||
      fail "the chief did not log the silent worker by name"
    status_of "$pid_w1"; ! timed_out "$st" || fail "worker 1 hung after SIGCONT"
    status_of "$pid_w0"; [[ $st == 0 ]] || fail "worker 0 did not exit 0"
    status_of "$pid_ps"; [[ $st == 0 ]] || fail "the ps task did not exit 0"
    echo "$(grep -c '^closures ' "$dir/chief.log") progress lines; worker 1 ended with $st after SIGCONT"
    ;;
  worker-resumed)
    start_tasks --closures 1000 --step-delay-ms 5
    start chief chief 0 "$trainer" --closures 1000 --step-delay-ms 5
    wait_for "$dir/chief.log" '^closures [0-9]+/1000' 30
    wait_for "$dir/chief.log" "connected /job:worker/replica:0/task:1 " 30
    stopped=$(pgrep -P "$pid_w1")
    [[ -n "$stopped" ]] || fail "no worker 1 process to stop"
    kill -STOP "$stopped"
    wait_for "$dir/chief.log" "lost /job:worker/replica:0/task:1 \\(it missed 6 heartbeats" 6
    kill -CONT "$stopped"
    wait_for "$dir/chief.log" "/job:worker/replica:0/task:1 answers again" 6
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief exited $st (expected 0)"
    grep -q '^result: ' "$dir/chief.log" || fail "no result line"
    [[ "$(result_field "$dir/chief.log" done)" == 1000 ]] || fail "done is not 1000"
    [[ "$(result_field "$dir/chief.log" workers_lost)" == 1 ]] || fail "workers_lost is not 1"
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"; [[ $st == 0 ]] || fail "$n did not exit 0"
    done
    ;;
  ps-stopped)
    start_tasks --closures 2000 --step-delay-ms 5
    start chief chief 0 "$trainer" --closures 2000 --step-delay-ms 5
    wait_for "$dir/chief.log" '^closures [0-9]+/2000' 30
    for w in 0 1; do wait_for "$dir/chief.log" "connected /job:worker/replica:0/task:$w " 30; done
    stopped=$(pgrep -P "$pid_ps")
    [[ -n "$stopped" ]] || fail "no ps process to stop"
    began=$(date +%s%N)
    kill -STOP "$stopped"
    status_of "$pid_chief"
    ms=$((($(date +%s%N) - began) / 1000000))
    kill -CONT "$stopped"
    [[ "$st" != 0 ]] && ! timed_out "$st" || fail "the chief exited $st (expected a failure of its own, not 0 or a timeout)"
    grep -q "ps task /job:ps/replica:0/task:0 is lost: it missed 6 heartbeats" "$dir/chief.log" ||
      fail "the chief's error does not name the silent ps task"
    [[ $ms -le 5000 ]] || fail "the chief took $ms ms to fail after the ps task stopped (at most 5000)"
    echo "the chief failed $ms ms after the ps task was stopped: $(grep 'ps_trainer:' "$dir/chief.log" | tail -n 1)"
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"
      ! timed_out "$st" || fail "$n hung after its chief failed"
    done
    ;;
  chief-stopped)
    start_tasks --closures 2000 --step-delay-ms 5
    start chief chief 0 "$trainer" --closures 2000 --step-delay-ms 5
    wait_for "$dir/chief.log" '^closures [0-9]+/2000' 30
    for w in 0 1; do wait_for "$dir/chief.log" "connected /job:worker/replica:0/task:$w " 30; done
    stopped=$(pgrep -P "$pid_chief")
    [[ -n "$stopped" ]] || fail "no chief process to stop"
    began=$(date +%s%N)
    kill -STOP "$stopped"
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"
      ! timed_out "$st" || fail "$n hung after its chief stopped"
      grep -q "lost the chief: it missed 6 heartbeats of 500 ms" "$dir/$n.log" || fail "$n did not name its silent chief"
    done
    ms=$((($(date +%s%N) - began) / 1000000))
    kill -KILL "$stopped"
    [[ $ms -le 10000 ]] || fail "the tasks took $ms ms to end after the chief stopped (at most 10000)"
    echo "every task ended within $ms ms of the chief stopping"
    ;;
  leave-early)
    task_args=()
    # Worker 1 comes up late, on a port the chief already has: when another process took it, the
    # whole cluster starts again on fresh ports (start_late).
    leave_early_start() {
      pick_ports
      start_listening task_listens launch_task ps w0
      start chief chief 0 "$chief_bin" --mode leave-early --wait-file "$dir/go"
      wait_for "$dir/chief.log" "cannot reach /job:worker/replica:0/task:1 " 30
      wait_for "$dir/chief.log" '^waiting for ' 30
      sleep 1  # past the one retry due before the chief set its reconnect interval to 60 s
      launch_task w1
    }
    start_late task_listens w1 leave_early_start
    task_listens w1 || fail "worker 1 ended before it listened on $p1"
    touch "$dir/go"
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief exited $st"
    left=$(date +%s%N)
    grep -q "connected /job:worker/replica:0/task:1 " "$dir/chief.log" && fail "the chief reached worker 1 (the case needs it unreached)"
    grep -q "told /job:worker/replica:0/task:1 that the chief leaves" "$dir/chief.log" ||
      fail "the chief did not tell worker 1 it leaves"
    status_of "$pid_w1"
    ms=$((($(date +%s%N) - left) / 1000000))
    [[ $st == 0 ]] || fail "worker 1 exited $st after a chief that never reached it left (expected 0; 124: it waited for its start timeout)"
    [[ $ms -le 10000 ]] || fail "worker 1 took $ms ms to end after the chief left (at most 10000)"
    grep -q "left /job:chief/replica:0/task:0 (it left before it reached this task)" "$dir/w1.log" ||
      fail "worker 1 did not log the chief leaving"
    echo "worker 1, never reached, ended $ms ms after the chief left"
    for n in w0 ps; do
      eval "p=\$pid_$n"
      status_of "$p"; [[ $st == 0 ]] || fail "$n did not exit 0 after its chief left"
      grep -q "left /job:chief/replica:0/task:0" "$dir/$n.log" || fail "$n did not log the chief leaving"
    done
    ;;
  daemons)
    start_daemons
    grep -q "functions: add, bump, bump_w, counting, empty, fail, fill, read_var, slow, stall_once, take, update_var, watch" "$dir/w0.log" || fail "the ready line lacks the module's functions"
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode basic >"$dir/chief.log" 2>&1
    st=$?
    [[ $st == 0 ]] || fail "the chief exited $st"
    [[ "$(grep -c '^PASS' "$dir/chief.log")" == 6 ]] || fail "not every check of the chief passed"
    for n in w0 w1 ps; do
      grep -q "connected /job:chief/replica:0/task:0" "$dir/$n.log" || fail "$n did not log the chief connecting"
      grep -q "left /job:chief/replica:0/task:0" "$dir/$n.log" || fail "$n did not log the chief leaving"
      eval "p=\$pid_$n"
      term_task "$p"
      status_of "$p"
      [[ "$st" == 0 ]] || fail "$n exited $st on SIGTERM (expected 0)"
      grep -q "^troupe-worker: stopped /job:" "$dir/$n.log" || fail "$n did not say it stopped"
    done
    ;;
  cancel)
    start_daemons
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode cancel >"$dir/chief.log" 2>&1
    st=$?
    [[ $st == 0 ]] || fail "the chief exited $st"
    [[ "$(grep -c '^PASS' "$dir/chief.log")" == 4 ]] || fail "not every check of the chief passed"
    grep '^PASS' "$dir/chief.log"
    stop_daemons
    ;;
  stall)
    export TROUPE_TEST_STALL_ONCE="$dir/stalled"
    start_daemons
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode stall >"$dir/chief.log" 2>"$dir/chief-stderr.log"
    st=$?
    [[ $st == 0 ]] || fail "the chief exited $st"
    [[ "$(grep -c '^PASS' "$dir/chief.log")" == 3 ]] || fail "not every check of the chief passed"
    grep '^PASS' "$dir/chief.log"
    err="$dir/chief-stderr.log"
    grep -Eq 'stall: closure 1 \(function "slow"\) has run on /job:worker/replica:0/task:[01] for 1 s$' "$err" ||
      fail "no stall line for the 2 s closure"
    grep -Eq 'stall cleared: closure 1 \(function "slow"\) finished on /job:worker/replica:0/task:[01] after 2 s$' "$err" ||
      fail "the stall of the 2 s closure was not cleared"
    grep -Eq 'stall: closure 2 \(function "stall_once"\) has run on /job:worker/replica:0/task:[01] for 3 s, past the stall shutdown bound \(3 s, TROUPE_STALL_SHUTDOWN_S\); /job:worker/replica:0/task:[01] is set aside until it returns: [0-9]+ closure\(s\) in flight go to other workers' "$err" ||
      fail "the stuck closure was not given up"
    grep -Eq 'returned from closure 2, given up on past the stall shutdown bound; it takes closures again' "$err" ||
      fail "the worker stuck in closure 2 was not taken back"
    grep -E 'stall|returned' "$err"
    stop_daemons
    ;;
  ps-checkpoint)
    nps=2
    ckpt="$build/tools/troupe-ckpt"
    ckdir="$dir/ckpt"
    start_daemons w0 w1 ps ps1
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 120 "$chief_bin" --mode ckpt-save --dir "$ckdir" \
      >"$dir/chief.log" 2>"$dir/chief-stderr.log" &
    pids+=($!)
    pid_chief=$!
    wait_for "$dir/chief.log" "^saved 1$" 60
    chief_proc=$(pgrep -P "$pid_chief")
    [[ -n "$chief_proc" ]] || fail "no chief process to kill"
    # SIGKILL the chief the moment a later save has begun (its temporary directory exists).
    timeout 60 python3 - "$ckdir" "$chief_proc" <<'PY' || fail "no save in progress to kill within 60 s"
import os, re, signal, sys, time
d, pid = sys.argv[1], int(sys.argv[2])
pattern = re.compile(r"ckpt-([2-9]|[1-9][0-9]+)\.tmp-[0-9]+-[0-9]+")
while not any(pattern.fullmatch(n) for n in os.listdir(d)):
    time.sleep(0.0005)
os.kill(pid, signal.SIGKILL)
PY
    status_of "$pid_chief"
    [[ $st == 137 ]] || fail "the chief exited $st, not killed by SIGKILL"
    saved=$(grep -c '^saved ' "$dir/chief.log")
    echo "the chief was killed during save $((saved + 1)) after $saved whole ones"
    interrupted=$(find "$ckdir" -maxdepth 1 -type d -name 'ckpt-*.tmp-*')
    [[ -n "$interrupted" ]] || fail "no interrupted save left in $ckdir"
    for t in $interrupted; do [[ ! -e "$t/manifest.json" ]] || fail "the interrupted save $t has a manifest"; done
    "$ckpt" "$ckdir" >"$dir/ckpt.out" 2>"$dir/ckpt.err" || fail "troupe-ckpt exited $? on the whole checkpoints: $(cat "$dir/ckpt.err")"
    grep -Eq "sharded checkpoints?, oldest first" "$dir/ckpt.out" || fail "troupe-ckpt listed no sharded checkpoint"
    grep -Eq "^  ckpt-$saved/ +step $saved, 2 variables, 2 shard files, intact$" "$dir/ckpt.out" ||
      fail "troupe-ckpt did not list ckpt-$saved as intact: $(cat "$dir/ckpt.out")"
    ! grep -q "ckpt-[0-9]*\.tmp-" "$dir/ckpt.out" || fail "troupe-ckpt listed the interrupted save"
    cat "$dir/ckpt.out"
    # Fresh daemons and a new chief: the newest whole checkpoint comes back.
    for n in w0 w1 ps ps1; do eval "p=\$pid_$n"; kill -9 -- "-$p" 2>/dev/null || kill -9 "$p"; wait "$p" 2>/dev/null; done
    start_daemons w0 w1 ps ps1
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode ckpt-check --dir "$ckdir" \
      >"$dir/check.log" 2>"$dir/check-stderr.log"
    st=$?
    [[ $st == 0 ]] || fail "the restoring chief exited $st: $(cat "$dir/check.log")"
    grep -q "^PASS restored checkpoint $saved: every element holds $saved$" "$dir/check.log" ||
      fail "checkpoint $saved was not restored: $(cat "$dir/check.log")"
    [[ -z "$(find "$ckdir" -maxdepth 1 -type d -name 'ckpt-*.tmp-*')" ]] || fail "the interrupted save was not removed"
    grep '^PASS' "$dir/check.log"
    # A damaged and a missing shard file: troupe-ckpt exits 1 naming each.
    printf '\xff\xff\xff\xff' | dd of="$ckdir/ckpt-$saved/shard-1-of-2.ckpt" bs=1 seek=100000 conv=notrunc status=none
    "$ckpt" "$ckdir" >"$dir/ckpt.out" 2>"$dir/ckpt.err"
    st=$?
    [[ $st == 1 ]] || fail "troupe-ckpt exited $st on a damaged shard file"
    grep -q "ckpt-$saved/shard-1-of-2.ckpt has [0-9]* bytes with XXH64 [0-9a-f]*, the manifest says" "$dir/ckpt.err" ||
      fail "troupe-ckpt did not name the damaged file: $(cat "$dir/ckpt.err")"
    grep -Eq "^  ckpt-$saved/ +step $saved, 2 variables, 2 shard files, 1 of 2 shard files damaged or missing$" "$dir/ckpt.out" ||
      fail "troupe-ckpt did not list ckpt-$saved as damaged: $(cat "$dir/ckpt.out")"
    cat "$dir/ckpt.out" "$dir/ckpt.err"
    rm "$ckdir/ckpt-$saved/shard-0-of-2.ckpt"
    "$ckpt" "$ckdir/ckpt-$saved" >"$dir/ckpt.out" 2>"$dir/ckpt.err"
    st=$?
    [[ $st == 1 ]] || fail "troupe-ckpt exited $st on a missing shard file"
    grep -q "ckpt-$saved/shard-0-of-2.ckpt is missing or unreadable" "$dir/ckpt.err" ||
      fail "troupe-ckpt did not name the missing file: $(cat "$dir/ckpt.err")"
    cat "$dir/ckpt.err"
    ;;
  heartbeat)
    start_daemons
    # Silence is lost after 8 heartbeats of 200 ms (1.6 s), and worker 1 is stopped for 2.7 s, less
    # than the default bound (6 x 500 ms): only the chief's settings can find it. Under load the
    # tasks left running were seen answering more than 600 ms late (3 x 200 ms lost the ps task,
    # which failed the run).
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode retry --closures 500 --slow-ms 20 \
      --heartbeat-ms 200 --missed 8 >"$dir/chief.log" 2>"$dir/chief-stderr.log" &
    pids+=($!)
    pid_chief=$!
    wait_for "$dir/chief-stderr.log" "connected /job:worker/replica:0/task:1 " 30
    wait_for "$dir/w1.log" "connected /job:chief/replica:0/task:0" 30
    sleep 0.3  # mid-run
    stopped=$(pgrep -P "$pid_w1")  # the daemon itself, not the timeout that runs it
    [[ -n "$stopped" ]] || fail "no worker 1 process to stop"
    kill -STOP "$stopped"
    sleep 2.7
    kill -CONT "$stopped"
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief exited $st"
    grep -q "result: closures=500 done=500 " "$dir/chief.log" || fail "not every closure was done"
    grep -q "lost /job:worker/replica:0/task:1 (it missed 8 heartbeats of 200 ms" "$dir/chief-stderr.log" ||
      fail "the chief did not detect the worker stopped for 2.7 s with 200 ms x 8 heartbeats"
    grep -q "/job:worker/replica:0/task:1 answers again" "$dir/chief-stderr.log" || fail "worker 1 was not taken back"
    grep -E "lost /job:worker/replica:0/task:1|answers again" "$dir/chief-stderr.log"
    stop_daemons
    ;;
  two-hosts)
    rm -rf "$dir"  # two_hosts.sh makes its own, and removes it with the namespaces
    source "$(dirname "$0")/../common/two_hosts.sh" cl 37
    token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    # The chief and worker 0 on host a, worker 1 and the ps task on host b.
    cluster() {
      echo "{\"chief\": [\"$net.1:$p3\"], \"worker\": [\"$net.1:$p0\", \"$net.2:$p1\"], \"ps\": [\"$net.2:$p2\"]}"
    }
    for t in "w0 worker 0 $a" "w1 worker 1 $b" "ps ps 0 $b" "chief chief 0 $a"; do
      set -- $t
      TROUPE_CLUSTER_TOKEN="$token" TF_CONFIG="$(tf_config "$2" "$3")" timeout -k 5 60 ip netns exec "$4" "$trainer" \
        --closures 100 >"$dir/$1.log" 2>&1 &
      pids+=($!)
      eval "pid_$1=$!"
    done
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief did not exit 0"
    check_training "$dir/chief.log" 100 0
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"; [[ $st == 0 ]] || fail "$n did not exit 0"
    done
    ;;
  bulk)
    nps=2
    dport_ps1=p5  # ps task 1 on a fixed data port (--data-port), ps task 0 on one the system picks
    start_daemons w0 w1 ps ps1
    wait_for "$dir/ps.log" "variables' data port 127.0.0.1:[0-9]+" 20
    grep -q "variables' data port 127.0.0.1:$p5\$" "$dir/ps1.log" ||
      fail "ps task 1 does not serve its data on the port --data-port $p5 gave it"
    data_port=$(grep -Eo "variables' data port 127.0.0.1:[0-9]+" "$dir/ps.log" | head -n 1 | cut -d: -f2)
    # Strangers: junk, a hello whose segment table claims 16 GiB, and one that stays silent while
    # the cluster works (refused once its time to prove itself is over).
    timeout 30 python3 - "$data_port" >"$dir/stranger.log" 2>&1 <<'PY' &
import socket, struct, sys, time
port = int(sys.argv[1])
def closed(s):
    s.settimeout(15)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
def send(s, data):
    # The ps task may refuse the stranger before all of it is written: a reset while sending is
    # that refusal, and closed() then reports the connection closed.
    try:
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass
junk = socket.create_connection(("127.0.0.1", port))
send(junk, b"GET / HTTP/1.0\r\n\r\n" + b"A" * 1000000)
huge = socket.create_connection(("127.0.0.1", port))
send(huge, struct.pack("<II", 0, 0x7FFFFFFF))
silent = socket.create_connection(("127.0.0.1", port))
print("junk closed:", closed(junk), flush=True)
print("huge closed:", closed(huge), flush=True)
print("silent connected", flush=True)
time.sleep(3)
print("silent closed:", closed(silent), flush=True)
PY
    pids+=($!)
    stranger=$!
    wait_for "$dir/stranger.log" '^silent connected' 20
    grep -q "junk closed: True" "$dir/stranger.log" || fail "the junk connection was not closed"
    grep -q "huge closed: True" "$dir/stranger.log" || fail "the 16 GiB hello was not closed"
    TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode bulk >"$dir/chief.log" 2>&1
    st=$?
    [[ $st == 0 ]] || fail "the chief exited $st"
    [[ "$(grep -c '^PASS' "$dir/chief.log")" == 2 ]] || fail "not every check of the chief passed"
    status_of "$stranger"
    grep -q "silent closed: True" "$dir/stranger.log" || fail "the silent connection was not closed"
    [[ "$(grep -c 'refused a data connection from 127.0.0.1:' "$dir/ps.log")" -ge 2 ]] ||
      fail "the ps task did not log the strangers it refused"
    ps_pid=$(pgrep -P "$pid_ps")
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$ps_pid/status")
    [[ "$hwm" -lt 400000 ]] || fail "the ps task's peak memory is $hwm kB (a stranger's claim was allocated?)"
    echo "ps task peak memory ${hwm} kB; $(grep -h '^PASS' "$dir/chief.log" | tr '\n' ' ')"
    ;;
  no-chief)
    # Ends 1 s after it listens: start_listening may see it listen or see it ended.
    launch_lonely() { TROUPE_START_TIMEOUT_MS=1000 start "$1" worker 0 "$trainer"; }
    start_listening task_listens launch_lonely w0
    status_of "$pid_w0"
    [[ $st == 1 ]] || fail "the worker exited $st (expected 1)"
    grep -q "Server: /job:worker/replica:0/task:0: no chief connected within 1000 ms" "$dir/w0.log" ||
      fail "the worker did not say why it stopped"
    ;;
  *)
    # A stranger, an impostor or a wrong token meets the cluster.
    source "$(dirname "$0")/stranger_scenarios.sh"
    ;;
esac
# A task whose shutdown ran into its bound (the one-binary roles end 5 s after their chief left,
# troupe-worker 30 s after its signal) hung: that is a failure even though the bound ended it.
if grep -l -e "still shutting down" -e "not stopped 30 s after" -e "did not stop within" "$dir"/*.log 2>/dev/null; then
  fail "a task's shutdown hung until its bound ended it (logs above)"
fi
echo "PASSED: $scenario"
