#!/usr/bin/env bash
# Runs the multi-worker test program in N real processes on loopback and checks what they print.
# Usage: run_cluster.sh WORKER_BINARY SCENARIO [STRANGER_BINARY]
# Every process is bounded by a timeout and killed on exit; the script fails with the outputs.
set -u
worker="$1"
scenario="$2"
stranger="${3:-}"
dir="$(mktemp -d)"
pids=()
source "$(dirname "$0")/../lib/cluster_common.sh"
log_of() { echo "$dir/out$1"; }
# A worker runs under timeout, which leads a process group of its own: the whole group goes, so
# that no worker outlives the scenario.
cleanup() {
  kill_tasks
  rm -rf "$dir"
}
trap cleanup EXIT

# The ports of a cluster of cluster_n tasks, afresh.
pick_ports() { read -r -a ports <<< "$(free_ports "$cluster_n")"; }
# launch_task I: task I of a cluster of cluster_n on ports, running mode cluster_mode, with the
# variables in W<I>_ENV; with cluster_chief=1, task 0 is a "chief" job and task I>0 is worker I-1.
launch_task() {
  local i="$1" list="" type=worker index="$1" k extra_var="W$1_ENV"
  if [ "${cluster_chief:-0}" = 1 ]; then
    for k in $(seq 1 $((cluster_n - 1))); do list+="${list:+, }\"127.0.0.1:${ports[$k]}\""; done
    list="\"chief\": [\"127.0.0.1:${ports[0]}\"], \"worker\": [$list]"
    if [ "$i" = 0 ]; then type=chief; else index=$((i - 1)); fi
  else
    for k in $(seq 0 $((cluster_n - 1))); do list+="${list:+, }\"127.0.0.1:${ports[$k]}\""; done
    list="\"worker\": [$list]"
  fi
  env TF_CONFIG="{\"cluster\": {$list}, \"task\": {\"type\": \"$type\", \"index\": $index}}" \
      ${!extra_var:-} timeout 60 "$worker" "$cluster_mode" > "$dir/out$i" 2>&1 &
  pids[$i]=$!
  eval "pid_$i=$!"
}
# The chief (task 0) listens on its port of TF_CONFIG (the others' rings listen on ports of their
# own choosing).
chief_listens() { listens "${pids[0]}" "${ports[0]}"; }
# start_tasks N MODE: every task at once, or with AFTER_CHIEF (a command run once, before the
# others) the chief first. The chief must listen (or end) within 20 s; when another process took
# its port, every task of the start is killed and all start again on fresh ports, up to 3 times.
start_tasks() {
  cluster_n="$1" cluster_mode="$2"
  local attempt i
  for attempt in 1 2 3; do
    pick_ports
    launch_task 0
    [ -n "${AFTER_CHIEF:-}" ] || for i in $(seq 1 $((cluster_n - 1))); do launch_task "$i"; done
    ready_or_ended chief_listens 0 $((SECONDS + 20))
    if ! port_taken 0; then
      if [ -n "${AFTER_CHIEF:-}" ]; then
        eval "$AFTER_CHIEF"
        for i in $(seq 1 $((cluster_n - 1))); do launch_task "$i"; done
      fi
      return
    fi
    echo "a port was taken (attempt $attempt, task 0): $(grep -h 'cannot listen' "$dir/out0" | head -n 1)"
    for i in $(seq 0 $((cluster_n - 1))); do
      [ -n "${pids[$i]:-}" ] && { kill_task "${pids[$i]}"; wait "${pids[$i]}" 2>/dev/null; }
    done
  done
  fail "no free ports after 3 tries"
}
# start_cluster N MODE: N workers; start_chief_cluster N MODE: a "chief" job of one task and a
# "worker" job of N-1 tasks.
start_cluster() { cluster_chief=0 start_tasks "$@"; }
start_chief_cluster() { cluster_chief=1 start_tasks "$@"; }

# wait_all N: waits for every worker, records exit codes in rc<i>.
wait_all() {
  for i in $(seq 0 $(($1 - 1))); do
    wait "${pids[$i]}"
    echo $? > "$dir/rc$i"
  done
}

fail() {
  echo "FAILED: $*"
  for f in "$dir"/out*; do echo "--- $f"; cat "$f"; done
  exit 1
}

expect_all() {  # N RC PATTERN
  for i in $(seq 0 $(($1 - 1))); do
    [ "$(cat "$dir/rc$i")" = "$2" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected $2"
    grep -q -- "$3" "$dir/out$i" || fail "worker $i did not print '$3'"
  done
}

# expect_cluster N REPLICAS: every worker exited 0, saw a cluster of N workers and REPLICAS replicas,
# named its own task, and passed every check ("OK <its rank>").
expect_cluster() {
  for i in $(seq 0 $(($1 - 1))); do
    [ "$(cat "$dir/rc$i")" = 0 ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 0"
    grep -qx "replicas $2 workers $1 task worker:$i" "$dir/out$i" ||
      fail "worker $i did not report a cluster of $1 workers and $2 replicas as task worker:$i"
    grep -qx "OK $i" "$dir/out$i" || fail "worker $i did not print 'OK $i'"
  done
}

# stops_under_defaults N VICTIM: N workers with default settings; task VICTIM stops itself with
# SIGSTOP after the first collective. Every other task must name it and exit 3 within 5 s of the
# stop; then the stopped one is killed.
stops_under_defaults() {
  local n="$1" victim="$2"
  for i in $(seq 0 $((n - 1))); do declare -g "W${i}_ENV=MW_STOPPING_TASK=$victim"; done
  start_cluster "$n" hang
  local stopped=""
  for _ in $(seq 1 600); do
    grep -q "^stopping" "$dir/out$victim" 2>/dev/null && { stopped=$(now_ms); break; }
    sleep 0.05
  done
  [ -n "$stopped" ] || fail "task $victim never reached its stop"
  for i in $(seq 0 $((n - 1))); do
    [ "$i" = "$victim" ] && continue
    wait "${pids[$i]}"; echo $? > "$dir/rc$i"
    local took=$(( $(now_ms) - stopped ))
    [ "$took" -lt 5000 ] || fail "task $i took $took ms to notice the stopped task $victim (bound: 5000)"
  done
  kill -9 "${pids[$victim]}" 2>/dev/null; wait "${pids[$victim]}" 2>/dev/null
  for i in $(seq 0 $((n - 1))); do
    [ "$i" = "$victim" ] && continue
    [ "$(cat "$dir/rc$i")" = "3" ] || fail "task $i exited $(cat "$dir/rc$i"), expected 3"
    grep -q "task:$victim.*sent no heartbeat" "$dir/out$i" || fail "task $i did not name the stopped task $victim"
  done
}

case "$scenario" in
  skipped-collective)
    # Worker 1 skips one all_reduce of step 2 that worker 0 makes: both fail naming both steps and
    # both numbers; none exits 0.
    start_cluster 2 skip; wait_all 2
    for i in 0 1; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "skipped, added or reordered a collective" "$dir/out$i" || fail "worker $i did not name the misalignment"
    done
    grep -q "rank 1 (127.0.0.1:[0-9]*) is at step 3, collective 0 .*rank 0 (this worker) at step 2, collective 1" \
      "$dir/out0" || fail "worker 0 did not name both sides and both numbers"
    grep -q "rank 0 (127.0.0.1:[0-9]*) is at step 2, collective 1 .*rank 1 (this worker) at step 3, collective 0" \
      "$dir/out1" || fail "worker 1 did not name both sides and both numbers" ;;
  skipped-collective-3x1)
    # Three workers: a small all-reduce goes both ways around the ring, so each worker receives
    # worker 1's frames or worker 1 theirs, and every one of them names the misalignment: from
    # its own frames, or (when the other step-2 worker's report reached it first) through the
    # watch's relay, which names worker 1 at step 3 and that worker at step 2 (as in 4x1).
    start_cluster 3 skip; wait_all 3
    for i in 0 1 2; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "skipped, added or reordered a collective" "$dir/out$i" || fail "worker $i did not name the misalignment"
    done
    relayed="cluster watch: /job:worker/replica:0/task:[02] (rank [02]) found the workers out of step: .*rank 1 (127.0.0.1:[0-9]*) is at step 3, collective 0 .*rank [02] at step 2, collective 1"
    for i in 0 2; do
      grep -q "rank 1 (127.0.0.1:[0-9]*) is at step 3, collective 0 .*rank $i (this worker) at step 2, collective 1\|$relayed" \
        "$dir/out$i" || fail "worker $i did not name both sides and both numbers"
    done ;;
  skipped-collective-4x1)
    # Four workers: worker 3 is no neighbour of worker 1 and never receives its frames; the
    # workers that do tell every other worker through the chief. Every worker names both
    # workers and both (step, collective) numbers; none exits 0.
    start_cluster 4 skip; wait_all 4
    for i in 0 1 2 3; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "skipped, added or reordered a collective" "$dir/out$i" || fail "worker $i did not name the misalignment"
    done
    # A worker names both sides from its own frames, or (when another worker's report reached it
    # first) through the watch's relay; either way both workers and both (step, collective).
    relayed="cluster watch: /job:worker/replica:0/task:[0-2] (rank [0-2]) found the workers out of step: .*rank [0-9] (127.0.0.1:[0-9]*) is at step [23], collective [01] .*rank [0-9] at step [23], collective [01]"
    for i in 0 2; do
      grep -q "rank 1 (127.0.0.1:[0-9]*) is at step 3, collective 0 .*rank $i (this worker) at step 2, collective 1\|$relayed" \
        "$dir/out$i" || fail "worker $i did not name both sides and both numbers"
    done
    grep -q "rank [02] (127.0.0.1:[0-9]*) is at step 2, collective 1 .*rank 1 (this worker) at step 3, collective 0\|$relayed" \
      "$dir/out1" || fail "worker 1 did not name both sides and both numbers"
    grep -q "$relayed" "$dir/out3" || fail "worker 3 did not name both sides and both numbers"
    grep -q "rank 1 (127.0.0.1:[0-9]*) is at step 3, collective 0 .*rank [02] at step 2, collective 1\|rank [02] (127.0.0.1:[0-9]*) is at step 2, collective 1 .*rank 1 at step 3, collective 0" \
      "$dir/out3" || fail "worker 3 did not name worker 1 and a worker of step 2" ;;
  chief-stops) stops_under_defaults 3 0 ;;
  worker-stops-defaults) stops_under_defaults 3 1 ;;
  input-fail-2x1)
    # Worker 1's input fails at its third element: both workers stop at that step, bounded.
    for i in 0 1; do declare "W${i}_ENV=MW_INPUT=fail MW_TIMEOUT_MS=20000"; done
    start_cluster 2 input; wait_all 2
    for i in 0 1; do
      [ "$(cat "$dir/rc$i")" = 3 ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
    done
    grep -q "^ERROR .*bad record 2 in worker 1's shard" "$dir/out1" || fail "worker 1 did not report its own cause"
    grep -q "^ERROR .*worker 1 failed to read its input" "$dir/out0" || fail "worker 0 did not name worker 1" ;;
  outside-scope-2x2)
    for i in 0 1; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2 MW_CKPT_DIR=$dir/ckpt"; done
    start_cluster 2 outside; wait_all 2; expect_cluster 2 4
    [ "$(ls "$dir/ckpt")" = "ckpt-3.ckpt" ] || fail "the checkpoint directory holds: $(ls "$dir/ckpt")" ;;
  input-*)
    # input-<data|off|file|uneven|fit|fit-data>-<workers>x<replicas per worker>: mw_worker input checks the
    # rows each worker got; here every worker must have run the same number of steps.
    spec="${scenario#input-}"; which="${spec%-*}"; shape="${spec##*-}"; n="${shape%x*}"; per="${shape#*x}"
    for i in $(seq 0 $((n - 1))); do
      declare "W${i}_ENV=MW_INPUT=$which MW_TIMEOUT_MS=20000 TROUPE_DEVICES_PER_WORKER=$per"
    done
    start_cluster "$n" input; wait_all "$n"; expect_cluster "$n" $((n * per))
    steps0="$(grep '^input steps' "$dir/out0")"
    [ -n "$steps0" ] || fail "worker 0 printed no step count"
    for i in $(seq 1 $((n - 1))); do
      [ "$(grep '^input steps' "$dir/out$i")" = "$steps0" ] || fail "worker $i ran other steps than worker 0 ($steps0)"
    done
    # fit, fit-data: every worker ends with the same weights.
    if [ "$which" = fit ] || [ "$which" = fit-data ]; then
      weights0="$(grep '^fit weights' "$dir/out0")"
      [ -n "$weights0" ] || fail "worker 0 printed no weights"
      for i in $(seq 1 $((n - 1))); do
        [ "$(grep '^fit weights' "$dir/out$i")" = "$weights0" ] || fail "worker $i ended with other weights than worker 0"
      done
    fi
    echo "every worker: $steps0" ;;
  collectives-2x1) start_cluster 2 collectives; wait_all 2; expect_cluster 2 2 ;;
  collectives-3x1) start_cluster 3 collectives; wait_all 3; expect_cluster 3 3 ;;
  collectives-4x1) start_cluster 4 collectives; wait_all 4; expect_cluster 4 4 ;;
  collectives-3x2)
    for i in 0 1 2; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2"; done
    start_cluster 3 collectives; wait_all 3; expect_cluster 3 6 ;;
  worker-hangs)
    for i in 0 1 2; do declare "W${i}_ENV=MW_TIMEOUT_MS=1500"; done
    start_cluster 3 hang
    for i in 0 2; do wait "${pids[$i]}"; echo $? > "$dir/rc$i"; done
    kill -9 "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
    for i in 0 2; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
    done
    # Worker 2 waits for worker 1 to send: it names it (by its timeout, or by the ring breaking
    # when worker 0 timed out first and left); someone's timeout fired.
    grep -q "task:1" "$dir/out2" || fail "worker 2 did not name the hung worker"
    grep -q "timed out after 1500 ms" "$dir/out0" "$dir/out2" || fail "no collective timed out" ;;
  worker-stops)
    # No collective timeout: the heartbeats alone find the stopped worker.
    for i in 0 1 2; do declare "W${i}_ENV=TROUPE_HEARTBEAT_MS=200"; done
    start=$(date +%s)
    start_cluster 3 hang
    for i in 0 2; do wait "${pids[$i]}"; echo $? > "$dir/rc$i"; done
    kill -9 "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
    [ $(( $(date +%s) - start )) -lt 20 ] || fail "the others took more than 20 s to notice"
    for i in 0 2; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "task:1 sent no heartbeat" "$dir/out$i" || fail "worker $i did not name the stopped worker"
    done ;;
  collectives-2x2)
    W0_ENV="TROUPE_DEVICES_PER_WORKER=2" W1_ENV="TROUPE_DEVICES_PER_WORKER=2" start_cluster 2 collectives
    wait_all 2; expect_cluster 2 4 ;;
  collectives-4x2)
    for i in 0 1 2 3; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2"; done
    start_cluster 4 collectives; wait_all 4; expect_cluster 4 8 ;;
  device-mismatch)
    W0_ENV="TROUPE_DEVICES_PER_WORKER=1" W1_ENV="TROUPE_DEVICES_PER_WORKER=2" start_cluster 2 join
    wait_all 2; expect_all 2 3 "workers have different device counts" ;;
  missing-worker)
    alone() {  # worker 0 alone: again on fresh ports when another process took its port
      read -r -a ports <<< "$(free_ports 2)"
      TF_CONFIG="{\"cluster\": {\"worker\": [\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
        TROUPE_START_TIMEOUT_MS=1500 timeout 60 "$worker" join > "$dir/out0" 2>&1
      echo $? > "$dir/rc0"
    }
    retry_if_taken "$dir/out0" alone
    expect_all 1 3 "still missing after 1500 ms: /job:worker/replica:0/task:1" ;;
  worker-dies)
    start_cluster 3 die; wait_all 3
    [ "$(cat "$dir/rc1")" = "137" ] || fail "worker 1 was not killed"
    for i in 0 2; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "cross-worker collective failed" "$dir/out$i" || fail "worker $i did not report the failed collective"
    done
    # Worker 2 receives from worker 1: it names it, from its socket or from the chief's verdict.
    # (Worker 0 may see worker 2 leave before the verdict arrives.)
    grep -q "task:1" "$dir/out2" || fail "worker 2 did not name worker 1" ;;
  chief-dies)
    # The chief is killed mid-collective: the others fail naming it, bounded, even though a chief
    # that leaves cleanly is not a failure.
    for i in 0 1 2; do declare "W${i}_ENV=MW_DYING_TASK=0"; done
    start_cluster 3 die; wait_all 3
    [ "$(cat "$dir/rc0")" = "137" ] || fail "the chief was not killed"
    for i in 1 2; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "cross-worker collective failed" "$dir/out$i" || fail "worker $i did not report the failed collective"
    done
    # Worker 1 receives from the chief: it names it, from its socket or from the watch.
    grep -q "task:0" "$dir/out1" || fail "worker 1 did not name the chief" ;;
  checkpoint-2x2)
    for i in 0 1; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2 MW_CKPT_DIR=$dir/ckpt"; done
    start_cluster 2 checkpoint; wait_all 2; expect_cluster 2 4
    [ "$(ls "$dir/ckpt")" = "ckpt-7.ckpt" ] || fail "the checkpoint directory holds: $(ls "$dir/ckpt")" ;;
  steer-2x2)
    # Model::fit steered from one worker (see mw_worker's steer): every worker pauses, resumes,
    # changes its rate, checkpoints and stops at the same step, with the same weights; the step's
    # reduction gives both every replica's loss (4) and every worker's step-time parts (2), and
    # the chief's stop reason.
    for i in 0 1; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2"; done
    start_cluster 2 steer; wait_all 2; expect_cluster 2 4
    want="steer paused=6 resumed=6 rate_changed=7 checkpoint=13 stopped=21 steps=21 rate_hook=6 replica_losses=4"
    want+=" worker_parts=2 stopped_for_chief=1 stopped_for_other=0 weights="
    for i in 0 1; do grep -q "^$want" "$dir/out$i" || fail "worker $i: expected '$want...'"; done
    [ "$(grep '^steer ' "$dir/out0")" = "$(grep '^steer ' "$dir/out1")" ] || fail "the workers' weights differ"
    grep -q "^reason stop requested by worker 0" "$dir/out1" || fail "worker 1 does not name the chief's stop"
    grep -q "^reason stop from the chief" "$dir/out0" || fail "the chief does not give its own reason" ;;
  preempt-3x1)
    # A termination watcher on worker 1 alone: every worker saves at step 5 and exits 75; run
    # again, every worker resumes at step 5 and finishes.
    for i in 0 1 2; do declare "W${i}_ENV=MW_CKPT_DIR=$dir/ckpt"; done
    start_cluster 3 preempt; wait_all 3
    expect_all 3 75 "^starting at step 0$"
    for i in 0 1 2; do
      grep -q "PreemptionCheckpointHandler: worker $i of 3: 1 worker(s) told to stop.*saving a checkpoint at step 5, then exiting with status 75$" "$dir/out$i" ||
        fail "worker $i did not save at step 5"
    done
    grep -q "worker 1 of 3: 1 worker(s) told to stop (this one by its termination watcher)" "$dir/out1" ||
      fail "worker 1 does not name its watcher"
    [ "$(ls "$dir/ckpt")" = "ckpt-5.ckpt" ] || fail "the checkpoint directory holds: $(ls "$dir/ckpt")"
    pids=()
    start_cluster 3 preempt; wait_all 3; expect_cluster 3 3
    expect_all 3 0 "^starting at step 5$" ;;
  packed-3x2)
    # CommunicationOptions::bytes_per_pack: the tensors of one all-reduce cross in several packs.
    for i in 0 1 2; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2 MW_BYTES_PER_PACK=24"; done
    start_cluster 3 collectives; wait_all 3; expect_cluster 3 6 ;;
  chief-3x1)
    # A "chief" job: the chief is rank 0, worker i is rank i+1.
    start_chief_cluster 3 collectives; wait_all 3
    for i in 0 1 2; do
      [ "$(cat "$dir/rc$i")" = 0 ] || fail "process $i exited $(cat "$dir/rc$i"), expected 0"
      grep -qx "OK $i" "$dir/out$i" || fail "process $i did not print 'OK $i'"
    done
    grep -qx "replicas 3 workers 3 task chief:0" "$dir/out0" || fail "the chief did not see 3 workers"
    grep -qx "replicas 3 workers 3 task worker:0" "$dir/out1" || fail "worker 0 did not see 3 workers"
    grep -qx "replicas 3 workers 3 task worker:1" "$dir/out2" || fail "worker 1 did not see 3 workers" ;;
  slurm-2x2)
    # SlurmClusterResolver through a real rendezvous: the variables srun sets for 2 tasks on one
    # node; worker i listens at port_base + i.
    # The chief first, listening at port_base (again on fresh ports when another process took it).
    pick_ports() { base=$(consecutive_ports 2) || fail "no free ports"; }
    launch_slurm() {
      env SLURM_PROCID=$1 SLURM_NTASKS=2 SLURM_JOB_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=2 \
          MW_RESOLVER=slurm MW_PORT_BASE="$base" TROUPE_DEVICES_PER_WORKER=2 \
          timeout 60 "$worker" collectives > "$dir/out$1" 2>&1 &
      pids[$1]=$!; eval "pid_$1=$!"
    }
    slurm_chief_listens() { listens "${pids[0]}" "$base"; }
    pick_ports; start_listening slurm_chief_listens launch_slurm 0; launch_slurm 1
    wait_all 2; expect_cluster 2 4 ;;
  mpi-2x1)
    # MpiClusterResolver under Open MPI's mpirun: ranks from OMPI_COMM_WORLD_*, the coordinator
    # from TROUPE_COORDINATOR, every other address learnt at rendezvous.
    command -v mpirun >/dev/null || fail "mpirun is not installed (tools/install-deps.sh installs openmpi-bin)"
    mpi_run() {  # again on a fresh port when another process took the coordinator's
      read -r -a ports <<< "$(free_ports 1)"
      rm -rf "$dir/mpi"
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=false \
        timeout 90 mpirun -n 2 --oversubscribe --output-filename "$dir/mpi" \
          -x TROUPE_COORDINATOR="127.0.0.1:${ports[0]}" -x MW_RESOLVER=mpi \
          "$worker" collectives > "$dir/mpirun.log" 2>&1
      rc=$?
      for i in 0 1; do cat "$dir"/mpi/1/rank.$i/stdout "$dir"/mpi/1/rank.$i/stderr > "$dir/out$i" 2>/dev/null; echo 0 > "$dir/rc$i"; done
    }
    retry_if_taken "$dir/out0" mpi_run
    [ "$rc" = 0 ] || fail "mpirun exited $rc: $(cat "$dir/mpirun.log")"
    expect_cluster 2 2 ;;
  isa-mix|isa-mix-cnn)
    # Two workers on different CPU kernel paths (two local replicas each): the forward passes
    # differ in their bits, the weights after every step do not. Needs a CPU with AVX2 and FMA.
    # isa-mix-cnn: the same for a CNN (Conv2D, MaxPooling2D, Flatten, Dense).
    if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
      echo "SKIPPED: this CPU lacks AVX2 and FMA, so it runs only the baseline path"; exit 77
    fi
    mode=train; [ "$scenario" = isa-mix-cnn ] && mode=train-cnn
    W0_ENV="TROUPE_CPU=baseline TROUPE_DEVICES_PER_WORKER=2" W1_ENV="TROUPE_CPU=avx2 TROUPE_DEVICES_PER_WORKER=2"
    start_cluster 2 "$mode"; wait_all 2; expect_cluster 2 4
    grep -q "^path baseline" "$dir/out0" || fail "worker 0 did not run the baseline path"
    grep -q "^path avx2" "$dir/out1" || fail "worker 1 did not run the avx2 path"
    [ "$(grep -c '^step .* weights' "$dir/out0")" = 12 ] || fail "worker 0 did not report 12 steps"
    [ "$(grep '^probe' "$dir/out0")" != "$(grep '^probe' "$dir/out1")" ] ||
      fail "the two paths computed the same forward bits: the test cannot tell them apart"
    diff <(grep '^step' "$dir/out0") <(grep '^step' "$dir/out1") > "$dir/diff" ||
      fail "the workers' weights differ: $(cat "$dir/diff")" ;;
  buckets-2x2|buckets-fit-2x2)
    # Model::train_step's gradient buckets, all-reduced across workers on the ring while backward
    # runs: every bucket size gives the weights of one all-reduce after backward (0), bit for
    # bit, on both workers. Gradient bytes in backward order: 40, 2560 | 256, 16384 | 256, 24576.
    # 1000: every tensor alone (layers split); 20000: the last two layers together; 1 GiB: all.
    # buckets-fit-2x2: the same through Model::fit with a metric (mlp_classifier's way), whose
    # step must take the bucketed path too ("exposed measured").
    mode=model; [ "$scenario" = buckets-fit-2x2 ] && mode=model-fit
    for bytes in 0 1000 20000 1073741824; do
      for i in 0 1; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2 TROUPE_GRADIENT_BUCKET_BYTES=$bytes"; done
      pids=(); start_cluster 2 "$mode"; wait_all 2; expect_cluster 2 4
      [ "$(grep -c '^step .* weights' "$dir/out0")" = 6 ] || fail "bucket $bytes: worker 0 did not report 6 steps"
      diff <(grep '^step' "$dir/out0") <(grep '^step' "$dir/out1") > "$dir/diff" ||
        fail "bucket $bytes: the workers' weights differ: $(cat "$dir/diff")"
      if [ "$bytes" = 0 ]; then
        grep '^step' "$dir/out0" > "$dir/reference"
        grep -qx "exposed none" "$dir/out0" || fail "the unbucketed run measured an exposed time"
      else
        diff "$dir/reference" <(grep '^step' "$dir/out0") > "$dir/diff" ||
          fail "bucket $bytes: the weights differ from the unbucketed run: $(cat "$dir/diff")"
        grep -qx "exposed measured" "$dir/out0" || fail "bucket $bytes: the bucketed path did not run"
      fi
    done ;;
  buckets-skipped-2x2)
    # A local replica enters an all_reduce without starting a bucket its leader started: the
    # leader's wait for the started buckets fails at once on every worker, naming the replica and
    # the bucket (it waited forever).
    for i in 0 1; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2"; done
    start_cluster 2 bucket-skip; wait_all 2
    expect_all 2 3 "replica 1 entered another collective (all_reduce, all_gather, merge_call) without starting bucket 1" ;;
  buckets-worker-dies)
    # A worker dies while the others' gradient buckets cross the ring: they fail, naming the
    # collective, instead of waiting for the bucket forever.
    for i in 0 1 2; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=2 TROUPE_GRADIENT_BUCKET_BYTES=1000 MW_DIE_AT_STEP=2"; done
    start_cluster 3 model; wait_all 3
    [ "$(cat "$dir/rc1")" = "137" ] || fail "worker 1 was not killed"
    for i in 0 2; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "cross-worker collective failed" "$dir/out$i" || fail "worker $i did not report the failed collective"
      [ "$(grep -c '^step .* weights' "$dir/out$i")" = 2 ] || fail "worker $i did not train the 2 steps before"
    done ;;
  compressed-2x2-fp16|compressed-2x2-bf16|compressed-2x1-none)
    # CommunicationOptions::compression: the float32 sums are the expected rounded ones (each
    # worker checks), and every replica of every worker holds the same bits.
    format="${scenario##*-}"
    devices=2; [ "$format" = none ] && devices=1
    for i in 0 1; do declare "W${i}_ENV=TROUPE_DEVICES_PER_WORKER=$devices MW_COMPRESSION=$format"; done
    start_cluster 2 compressed; wait_all 2; expect_cluster 2 $((2 * devices))
    [ "$(cat "$dir"/out0 "$dir"/out1 | grep -c '^compressed ')" = $((2 * devices)) ] ||
      fail "not every replica reported its result"
    [ "$(cat "$dir"/out0 "$dir"/out1 | grep '^compressed ' | awk '{print $3}' | sort -u | wc -l)" = 1 ] ||
      fail "the replicas' results differ in their bits" ;;
  compression-mismatch)
    # One worker compresses, the other does not: the first all-reduce fails on both, naming the peer.
    W0_ENV="MW_COMPRESSION=fp16" W1_ENV="MW_COMPRESSION=none" start_cluster 2 compressed
    wait_all 2; expect_all 2 3 "cross-worker collective failed"
    # Worker 1 receives worker 0's float16 frames where it expects float32, and says so.
    grep -q "it sent float16, this worker expected float32: every worker must all-reduce the same dtype with the same CommunicationOptions::compression" "$dir/out1" ||
      fail "worker 1 did not name the element types" ;;
  flight-recorder-dies)
    # A worker killed mid-step: the survivor's failure names its flight recorder dump, which holds
    # its last collectives with the failed one last: step 2's all-reduce, waiting on worker 1.
    for i in 0 1; do declare "W${i}_ENV=TROUPE_FLIGHT_RECORDER_DIR=$dir/fr"; done
    start_cluster 2 die; wait_all 2
    [ "$(cat "$dir/rc1")" = "137" ] || fail "worker 1 was not killed"
    [ "$(cat "$dir/rc0")" = "3" ] || fail "worker 0 exited $(cat "$dir/rc0"), expected 3"
    grep -q "cross-worker collective failed.*(flight recorder: $dir/fr/flight_recorder.rank0.json)" "$dir/out0" ||
      fail "worker 0's error does not name its dump"
    python3 - "$dir/fr/flight_recorder.rank0.json" <<'PY' || fail "worker 0's dump is not what it should be"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "troupe-flight-recorder" and d["version"] == 1, d
assert d["rank"] == 0 and d["world"] == 2 and d["task"], d
assert "cross-worker collective failed" in d["reason"], d["reason"]
ring = [e for e in d["entries"] if e["group"] == "workers"]
assert [(e["step"], e["collective"], e["op"]) for e in ring] == [(1, 0, "all_reduce"), (2, 0, "all_reduce")], ring
assert ring[0]["state"] == "done" and ring[0]["dtype"] == "float32" and ring[0]["bytes"] == 400, ring[0]
assert ring[1]["state"] == "failed" and ring[1]["peer"] == 1, ring[1]
assert ring[1]["end_ns"] >= ring[1]["start_ns"] >= ring[1]["enqueue_ns"], ring[1]
steps = [e for e in d["entries"] if e["op"] == "step"]
assert [(e["step"], e["state"]) for e in steps] == [(1, "done"), (2, "failed")], steps
PY
    ;;
  flight-recorder-timeout)
    # A worker stops (SIGSTOP) after step 1: the other's all-reduce of step 2 times out, and its
    # dump, named in the error, ends in that collective, failed, waiting on worker 1.
    for i in 0 1; do declare "W${i}_ENV=MW_TIMEOUT_MS=1500 TROUPE_FLIGHT_RECORDER_DIR=$dir/fr"; done
    start_cluster 2 hang
    wait "${pids[0]}"; echo $? > "$dir/rc0"
    kill -9 "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
    [ "$(cat "$dir/rc0")" = "3" ] || fail "worker 0 exited $(cat "$dir/rc0"), expected 3"
    grep -q "timed out after 1500 ms.*(flight recorder: $dir/fr/flight_recorder.rank0.json)" "$dir/out0" ||
      fail "worker 0's timeout does not name its dump"
    python3 - "$dir/fr/flight_recorder.rank0.json" <<'PY' || fail "worker 0's dump is not what it should be"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["rank"] == 0 and d["world"] == 2, d
assert "timed out after 1500 ms" in d["reason"], d["reason"]
ring = [e for e in d["entries"] if e["group"] == "workers"]
assert [(e["step"], e["collective"], e["state"]) for e in ring] == [(1, 0, "done"), (2, 0, "failed")], ring
assert ring[1]["peer"] == 1, ring[1]
assert ring[1]["end_ns"] - ring[1]["start_ns"] >= 1_400_000_000, ring[1]  # it waited the timeout
PY
    ;;
  flight-recorder-skipped)
    # Worker 1 skips a collective: each worker's dump ends in the failed collective, with the
    # (step, collective) each was in, which is what a tool reading every dump compares.
    for i in 0 1; do declare "W${i}_ENV=TROUPE_FLIGHT_RECORDER_DIR=$dir/fr"; done
    start_cluster 2 skip; wait_all 2
    for i in 0 1; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "(flight recorder: $dir/fr/flight_recorder.rank$i.json)" "$dir/out$i" ||
        fail "worker $i's error does not name its dump"
    done
    python3 - "$dir/fr" <<'PY' || fail "the dumps do not show where each worker was"
import json, sys
last = {}
for rank in (0, 1):
    d = json.load(open(f"{sys.argv[1]}/flight_recorder.rank{rank}.json"))
    assert d["rank"] == rank and d["world"] == 2, d
    failed = [e for e in d["entries"] if e["group"] == "workers" and e["state"] == "failed"]
    assert len(failed) == 1, failed
    assert failed[0]["peer"] == 1 - rank, failed[0]
    last[rank] = (failed[0]["step"], failed[0]["collective"])
assert last == {0: (2, 1), 1: (3, 0)}, last
PY
    ;;
  stall-warning)
    # Worker 1 stops itself (SIGSTOP) in step 3's compute; worker 0 waits in that step's
    # all-reduce. With TROUPE_STALL_WARNING_S=2 the chief's stall line names worker 1 within 3 s
    # (warning + 1 s) of the stop; once worker 1 is continued the chief says the stall is over
    # and both finish. Heartbeats may be missed for 30 s, so the stop is a stall, not a death.
    for i in 0 1; do declare "W${i}_ENV=TROUPE_STALL_WARNING_S=2 TROUPE_MISSED_HEARTBEATS=60"; done
    start_cluster 2 stall
    wait_for_line "$dir/out1" "stopping in step 3" 30 || fail "worker 1 did not stop"
    stopped_at=$(date +%s%N)
    line="troupe: stall: step 3 all_reduce #0 (float32, 1.0 MiB): worker 0 waiting [0-9]* s; worker 1 is silent: its last heartbeat, [0-9.]* s ago, had it in step 3 compute"
    wait_for_line "$dir/out0" "$line" 10 || fail "the chief printed no stall line naming worker 1"
    named_ms=$(( ($(date +%s%N) - stopped_at) / 1000000 ))
    [ "$named_ms" -le 3000 ] || fail "the stall line came $named_ms ms after the stop (expected within 3000 ms)"
    kill -CONT -- "-${pids[1]}"
    wait_all 2
    expect_all 2 0 "trained 6 steps"
    grep -q "troupe: stall cleared: step 3 all_reduce #0 completed; every worker moved on" "$dir/out0" ||
      fail "the chief did not say the stall was over"
    echo "stall named after $named_ms ms" ;;
  stall-shutdown)
    # The same stop with TROUPE_STALL_SHUTDOWN_S=3: the chief ends the cluster, and every worker
    # fails with the stall line as its error (worker 1 once it is continued).
    for i in 0 1; do declare "W${i}_ENV=TROUPE_STALL_WARNING_S=1 TROUPE_STALL_SHUTDOWN_S=3 TROUPE_MISSED_HEARTBEATS=60"; done
    start_cluster 2 stall
    wait_for_line "$dir/out1" "stopping in step 3" 30 || fail "worker 1 did not stop"
    wait "${pids[0]}"; echo $? > "$dir/rc0"
    kill -CONT -- "-${pids[1]}"
    wait "${pids[1]}"; echo $? > "$dir/rc1"
    line="stall: step 3 all_reduce #0 (float32, 1.0 MiB): worker 0 waiting [0-9]* s; worker 1 is silent: its last heartbeat, [0-9.]* s ago, had it in step 3 compute"
    grep -q "troupe: the chief ended the cluster: a worker waited longer than the stall shutdown bound (3 s, TROUPE_STALL_SHUTDOWN_S): $line" "$dir/out0" ||
      fail "the chief did not say why it ended the cluster"
    expect_all 2 3 "^ERROR .*$line" ;;
  silent-link)
    # Worker 0's ring link to worker 1 stops forwarding in step 3 (silent_link_shim, $3), while
    # both workers keep beating. The chief's stall line names the link (from worker 0 to worker 1),
    # and with TROUPE_STALL_SHUTDOWN_S=3 every worker fails with that line instead of waiting.
    for i in 0 1; do
      declare -g "W${i}_ENV=TROUPE_CLUSTER_TOKEN=secret-$$ TROUPE_STALL_WARNING_S=1 TROUPE_STALL_SHUTDOWN_S=3"
    done
    W0_ENV="$W0_ENV LD_PRELOAD=$stranger"
    start_cluster 2 silent-link; wait_all 2
    grep -q "^silent link: swallowing" "$dir/out0" || fail "the shim silenced no link of worker 0"
    line="stall: step 3 all_reduce #0 (float32, 1.0 MiB): workers 0, 1 waiting [0-9]* s; every worker waits in it: the ring link from worker 0 to worker 1 lost [0-9]* bytes (sent, never received) and moved no byte for [0-9]* s"
    grep -q "^troupe: $line" "$dir/out0" || fail "the chief's stall line did not name the link from worker 0 to worker 1"
    expect_all 2 3 "^ERROR .*the chief ended the cluster: .*$line" ;;
  skip-doctor|mismatch-dtype|mismatch-size)
    # A worker skips a collective, or all-reduces another dtype or size in one: every worker
    # fails and writes its dump; troupe-doctor (the third argument) names the worker and the
    # collective, and exits 1.
    for i in 0 1; do declare "W${i}_ENV=TROUPE_FLIGHT_RECORDER_DIR=$dir/fr MW_MISMATCH=${scenario#mismatch-}"; done
    start_cluster 2 "$([ "$scenario" = skip-doctor ] && echo skip || echo mismatch)"; wait_all 2
    for i in 0 1; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      [ -s "$dir/fr/flight_recorder.rank$i.json" ] || fail "worker $i wrote no dump"
    done
    "$stranger" "$dir/fr" > "$dir/doctor" 2>&1; echo $? > "$dir/rc_doctor"
    cat "$dir/doctor"
    [ "$(cat "$dir/rc_doctor")" = "1" ] || fail "troupe-doctor exited $(cat "$dir/rc_doctor"), expected 1"
    case "$scenario" in
      skip-doctor) want="fault: rank 1 never entered step 2 all_reduce #1 (all_reduce float32 16 B), in which rank 0 waits; it went on to step 3 all_reduce #0 (failed): the order of collectives differs" ;;
      mismatch-dtype) want="fault: the workers disagree in step 2 collective #1 (dtype, bytes): all_reduce float32 16 B on rank 0; all_reduce float64 32 B on rank 1" ;;
      mismatch-size) want="fault: the workers disagree in step 2 collective #1 (bytes): all_reduce float32 16 B on rank 0; all_reduce float32 32 B on rank 1" ;;
    esac
    grep -qxF "$want" "$dir/doctor" || fail "troupe-doctor did not say: $want" ;;
  *)
    # A stranger, a forger or a wrong token meets the cluster.
    source "$(dirname "$0")/stranger_scenarios.sh"
    ;;
esac
[ -n "${MW_SHOW:-}" ] && for f in "$dir"/out*; do echo "--- $f"; cat "$f"; done
echo "PASSED $scenario"
