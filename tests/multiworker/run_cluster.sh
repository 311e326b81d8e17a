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
cleanup() {
  # A worker runs under timeout, which leads a process group of its own: the whole group goes,
  # so that no worker outlives the scenario.
  for p in "${pids[@]:-}"; do [ -n "$p" ] && { kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null; }; done
  rm -rf "$dir"
}
trap cleanup EXIT

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# start N [ENV=VALUE...] per worker through W<i>_ENV variables; mode in MODE.
start_cluster() {
  local n="$1" mode="$2"
  read -r -a ports <<< "$(free_ports "$n")"
  local list=""
  for i in $(seq 0 $((n - 1))); do list+="${list:+, }\"127.0.0.1:${ports[$i]}\""; done
  for i in $(seq 0 $((n - 1))); do
    local extra_var="W${i}_ENV"
    env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
        ${!extra_var:-} timeout 60 "$worker" "$mode" > "$dir/out$i" 2>&1 &
    pids+=($!)
    # AFTER_CHIEF: a command run once the first worker (the chief) started, before the others.
    if [ "$i" = 0 ] && [ -n "${AFTER_CHIEF:-}" ]; then eval "$AFTER_CHIEF"; fi
  done
}

# start_chief_cluster N MODE: a "chief" job of one task and a "worker" job of N-1 tasks.
start_chief_cluster() {
  local n="$1" mode="$2"
  read -r -a ports <<< "$(free_ports "$n")"
  local workers=""
  for i in $(seq 1 $((n - 1))); do workers+="${workers:+, }\"127.0.0.1:${ports[$i]}\""; done
  local cluster="\"chief\": [\"127.0.0.1:${ports[0]}\"], \"worker\": [$workers]"
  env TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"chief\", \"index\": 0}}" \
      timeout 60 "$worker" "$mode" > "$dir/out0" 2>&1 &
  pids+=($!)
  for i in $(seq 1 $((n - 1))); do
    env TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"worker\", \"index\": $((i - 1))}}" \
        timeout 60 "$worker" "$mode" > "$dir/out$i" 2>&1 &
    pids+=($!)
  done
}

# consecutive_ports N: the first of N consecutive free ports on loopback.
consecutive_ports() {
  python3 - "$1" <<'PY'
import socket, sys
n = int(sys.argv[1])
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; s.close()
    if base + n > 65535: continue
    try:
        socks = []
        for p in range(base, base + n):
            t = socket.socket(); t.bind(("127.0.0.1", p)); socks.append(t)
        print(base); sys.exit(0)
    except OSError:
        pass
    finally:
        for t in socks: t.close()
sys.exit("no run of free ports found")
PY
}

# wait_all N: waits for every worker, records exit codes in rc<i>.
wait_all() {
  for i in $(seq 0 $(($1 - 1))); do
    wait "${pids[$i]}"
    echo $? > "$dir/rc$i"
  done
}

# wait_for_line FILE PATTERN SECONDS: true once FILE has a line matching PATTERN (grep), false
# after SECONDS.
wait_for_line() {
  local deadline=$(( $(date +%s%N) + $3 * 1000000000 ))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    [ "$(date +%s%N)" -lt "$deadline" ] || return 1
    sleep 0.05
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

# stranger_attack MODE: worker 1 starts alone; ring_stranger finds its ring port and attacks it
# during start-up; worker 0 starts once the stranger is in. The stranger must be refused and
# logged by worker 1 (naming the stranger's address), the cluster must form and compute the
# right values, and no worker may fail or be blamed.
stranger_attack() {
  local mode="$1"
  read -r -a ports <<< "$(free_ports 2)"
  local list="\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\""
  env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": 1}}" \
      timeout 60 "$worker" collectives > "$dir/out1" 2>&1 &
  local w1=$!
  timeout 40 "$stranger" "$mode" "$w1" > "$dir/stranger" 2>&1 &
  local s=$!
  for _ in $(seq 200); do grep -q "^attacking" "$dir/stranger" && break; sleep 0.05; done
  grep -q "^attacking" "$dir/stranger" || fail "the stranger did not get in: $(cat "$dir/stranger")"
  # The ring listens on the address TF_CONFIG gives, not on every interface.
  grep -q "^attacking [0-9]* bound to 127.0.0.1$" "$dir/stranger" ||
    fail "worker 1's ring port is not bound to its TF_CONFIG address: $(cat "$dir/stranger")"
  env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
      timeout 60 "$worker" collectives > "$dir/out0" 2>&1 &
  pids=($! "$w1" "$s")
  wait_all 2
  wait "$s"; local src=$?
  cat "$dir/stranger" >> "$dir/out1"
  expect_cluster 2 2
  [ "$src" = 0 ] || fail "the stranger's connections were not closed by worker 1 (exit $src)"
  grep -q "troupe: ring rank 1 refused a connection from 127.0.0.1:" "$dir/out1" ||
    fail "worker 1 did not log the refused stranger with its address"
  if grep -q "ERROR\|cross-worker collective failed" "$dir"/out0 "$dir"/out1; then fail "a worker was blamed"; fi
}

now_ms() { date +%s%3N; }

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

attacker_bin="$(dirname "$worker")/mw_attacker"

# start_with_attacker N MODE ATTACK_ARGS...: the chief first, then the stranger (mw_attacker
# ATTACK_ARGS, with the chief's port after the host), once it printed ATTACK_WAIT (default: it
# reached the chief) the others.
start_with_attacker() {
  local n="$1" mode="$2"
  attack_what="$3"; shift 3; attack_args=("$@")
  launch_attacker() {
    "$attacker_bin" "$attack_what" 127.0.0.1 "${ports[0]}" "${attack_args[@]}" > "$dir/attacker" 2>&1 &
    attacker=$!
    for _ in $(seq 1 3000); do grep -q "${ATTACK_WAIT:-attacker: connected}" "$dir/attacker" 2>/dev/null && break; sleep 0.02; done
  }
  AFTER_CHIEF=launch_attacker start_cluster "$n" "$mode"
}

# peak_rss_kb PID: follows PID (timeout(1), whose child is the worker) until it exits and prints
# the worker's peak resident memory in kB.
peak_rss_kb() {
  local peak=0 kb
  while kill -0 "$1" 2>/dev/null; do
    for c in $(pgrep -P "$1" 2>/dev/null); do
      kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$c/status" 2>/dev/null || echo 0)
      [ -n "$kb" ] && [ "$kb" -gt "$peak" ] && peak=$kb
    done
    sleep 0.02
  done
  echo "$peak"
}

case "$scenario" in
  stranger-old-hello)
    stranger_attack old-hello
    grep -q "it speaks protocol version 4, this worker 6" "$dir/out1" || fail "the old hello was not refused as such" ;;
  stranger-replay)
    stranger_attack replay
    grep -q "^replayed" "$dir/out1" || fail "the stranger did not replay" ;;
  stranger-garbage) stranger_attack garbage ;;
  stranger-silent)
    stranger_attack silent
    grep -q "it had not proven itself when the ring was formed" "$dir/out1" || fail "the silent stranger was not logged" ;;
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
  tampered-frame-4x1)
    # With a token, worker 0 runs with tamper_shim preloaded ($3): one bit of the first float32
    # 12345 it sends is flipped on its way to the socket, as a relay on the link would. Every
    # worker fails (exit 3) and none returns the altered sum: the worker that received the frame
    # names its integrity check and rank 0, and the others learn it through the watch as the ring
    # link from rank 0 tampered with, never as workers out of step.
    for i in 0 1 2 3; do declare -g "W${i}_ENV=TROUPE_CLUSTER_TOKEN=secret-$$"; done
    W0_ENV="$W0_ENV LD_PRELOAD=$stranger"
    start_cluster 4 tamper; wait_all 4
    grep -q "^tamper: flipped a bit" "$dir/out0" || fail "the shim altered no frame of worker 0"
    own="a frame from rank 0 (127.0.0.1:[0-9]*) failed its integrity check"
    relayed="cluster watch: /job:worker/replica:0/task:[13] (rank [13]) found the ring link from /job:worker/replica:0/task:0 (rank 0) tampered with: $own"
    for i in 0 1 2 3; do
      [ "$(cat "$dir/rc$i")" = "3" ] || fail "worker $i exited $(cat "$dir/rc$i"), expected 3"
      if grep -q "wrong sum\|found the workers out of step" "$dir/out$i"; then fail "worker $i saw a wrong sum or blamed the workers' order"; fi
    done
    grep -q "ERROR.*$own" "$dir/out1" "$dir/out3" || fail "no neighbour of worker 0 named the frame's integrity check"
    for i in 0 2; do grep -q "$relayed" "$dir/out$i" || fail "worker $i did not learn of the link tampered with"; done ;;
  token-required)
    # A cluster beyond loopback (192.0.2.1 is TEST-NET-1) without a token refuses to start,
    # naming both ways out; told insecure it starts (and finds the other task missing).
    read -r -a ports <<< "$(free_ports 1)"
    cfg="{\"cluster\": {\"worker\": [\"127.0.0.1:${ports[0]}\", \"192.0.2.1:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}"
    env -u TROUPE_CLUSTER_TOKEN TF_CONFIG="$cfg" timeout 60 "$worker" join > "$dir/out0" 2>&1; echo $? > "$dir/rc0"
    expect_all 1 3 "spans more than loopback (192.0.2.1:2222) and no cluster token is set.*TROUPE_CLUSTER_TOKEN.*TROUPE_INSECURE=1"
    env -u TROUPE_CLUSTER_TOKEN TROUPE_INSECURE=1 TROUPE_START_TIMEOUT_MS=1000 TF_CONFIG="$cfg" timeout 60 "$worker" join \
      > "$dir/out0" 2>&1; echo $? > "$dir/rc0"
    expect_all 1 3 "still missing after 1000 ms: /job:worker/replica:0/task:1"
    TROUPE_INSECURE=yes TF_CONFIG="$cfg" timeout 60 "$worker" join > "$dir/out0" 2>&1; echo $? > "$dir/rc0"
    expect_all 1 3 'TROUPE_INSECURE="yes" is not 0 or 1' ;;
  forged-bye-beats)
    # A cluster without a token (loopback): a stranger forges a goodbye and heartbeats for task 1,
    # which then stops. They count only from the peer that joined as task 1: every other task
    # still names it within 5 s, and the chief logs the refusals.
    for i in 0 1 2; do declare "W${i}_ENV=MW_STOPPING_TASK=1"; done
    start_with_attacker 3 hang forge 1 12
    stopped=""
    for _ in $(seq 1 600); do
      grep -q "^stopping" "$dir/out1" 2>/dev/null && { stopped=$(now_ms); break; }
      sleep 0.05
    done
    [ -n "$stopped" ] || fail "task 1 never reached its stop"
    for i in 0 2; do
      wait "${pids[$i]}"; echo $? > "$dir/rc$i"
      took=$(( $(now_ms) - stopped ))
      [ "$took" -lt 5000 ] || fail "task $i took $took ms to notice the stopped task 1 under forged beats"
      [ "$(cat "$dir/rc$i")" = 3 ] || fail "task $i exited $(cat "$dir/rc$i"), expected 3"
      grep -q "task:1 sent no heartbeat" "$dir/out$i" || fail "task $i did not name the stopped task 1"
    done
    kill -9 "${pids[1]}" "$attacker" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
    grep -q "refused a goodbye for rank 1" "$dir/out0" || fail "the chief did not log the forged goodbye"
    grep -q "refused a heartbeat for rank 1" "$dir/out0" || fail "the chief did not log the forged heartbeat"
    # The forged beats' position (an hour in a collective) never reached the stall inspector.
    if grep -q "troupe: stall" "$dir/out0"; then fail "a forged position made the chief report a stall"; fi ;;
  forged-fault)
    # A cluster without a token (loopback): a stranger of the same user reaches the chief and
    # forges fault reports (workers out of step) for task 1 while the cluster forms and computes.
    # A report counts only from the peer that joined as that rank: none is passed on, the chief
    # logs the refusals, and every worker computes right.
    start_with_attacker 3 collectives fault 1 4
    wait_all 3; kill "$attacker" 2>/dev/null; wait "$attacker" 2>/dev/null
    grep -q "refused a fault report for rank 1 from .*which did not join as that rank \[connected from 127.0.0.1:[0-9]*\]" \
      "$dir/out0" || fail "the chief did not log the forged fault report with the stranger's address"
    if grep -q "forged: rank 1" "$dir"/out*; then fail "a forged fault report reached a worker"; fi
    expect_cluster 3 3 ;;
  stranger-bad-join)
    # On a cluster without a token (loopback), a stranger joins as task 1 with a wrong proof
    # before task 1 starts: it is refused alone and logged, and the cluster forms and computes.
    ATTACK_WAIT="attacker: done" start_with_attacker 3 collectives bad-join 1
    wait_all 3; wait "$attacker"
    grep -q "attacker: refused.*refused a join claiming to be /job:worker/replica:0/task:1" "$dir/attacker" ||
      fail "the stranger's join was not refused: $(cat "$dir/attacker")"
    grep -q "troupe: rendezvous: refused a join claiming to be /job:worker/replica:0/task:1" "$dir/out0" ||
      fail "the chief did not log the refused join"
    expect_cluster 3 3 ;;
  nonce-flood)
    # A stranger asks a chief without a token for 400000 nonces before the cluster forms: the
    # nonces it holds are bounded, its memory stays small, and the cluster computes right.
    # The others start once the chief answered the flood's last request: it handled all of it.
    ATTACK_WAIT="attacker: done" start_with_attacker 3 collectives nonce-flood 400000
    peak_kb=$(peak_rss_kb "${pids[0]}")
    wait_all 3; wait "$attacker"
    grep -q "attacker: done 400000" "$dir/attacker" || fail "the flood did not finish: $(cat "$dir/attacker")"
    expect_cluster 3 3
    echo "the chief's peak resident memory: $peak_kb kB"
    [ "$peak_kb" -gt 0 ] && [ "$peak_kb" -lt 49152 ] || fail "the chief's peak resident memory was $peak_kb kB" ;;
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
  bad-token)
    # A worker with another token fails the TLS handshake: it cannot abort the start, it is only
    # missing (the chief names it at its deadline), and it names the token as the likely cause.
    W0_ENV="TROUPE_CLUSTER_TOKEN=secret TROUPE_START_TIMEOUT_MS=3000"
    W1_ENV="TROUPE_CLUSTER_TOKEN=guess TROUPE_START_TIMEOUT_MS=3000"
    start_cluster 2 join; wait_all 2
    expect_all 1 3 "still missing after 3000 ms: /job:worker/replica:0/task:1"
    [ "$(cat "$dir/rc1")" = 3 ] || fail "worker 1 exited $(cat "$dir/rc1"), expected 3"
    grep -q "could not reach the chief.*TROUPE_CLUSTER_TOKEN" "$dir/out1" || fail "worker 1 did not name the token"
    # The chief logs the refused handshakes with the peer's address, and goes on to its deadline.
    grep -q "troupe: control plane: refused the connection from 127.0.0.1:[0-9]*: its TLS handshake failed" "$dir/out0" ||
      fail "the chief did not log the failed handshakes with the peer's address" ;;
  stranger-basp-header|stranger-basp-header-plain|stranger-bad-token)
    # A stranger attacks the chief's rendezvous port while a cluster forms, with a token (mutual
    # TLS) or without one (plain BASP behind the gate): the chief logs the refusal with the
    # stranger's address, the cluster forms and computes right, and the chief's resident memory
    # stays small (a middleman facing the header alone reserves its 4 GiB).
    if [ "$scenario" != stranger-basp-header-plain ]; then
      for i in 0 1 2; do declare "W${i}_ENV=TROUPE_CLUSTER_TOKEN=secret-$$"; done
    fi
    # The stranger strikes between the chief's start and the others'.
    attack() {
      if [ "$scenario" != stranger-bad-token ]; then
        "$(dirname "$0")/attacker.py" basp-header 127.0.0.1 "${ports[0]}" 3 > "$dir/attacker" 2>&1 &
      else
        "$(dirname "$0")/attacker.py" bad-token 127.0.0.1 "${ports[0]}" > "$dir/attacker" 2>&1 &
      fi
      attacker=$!
      for _ in $(seq 1 300); do grep -q "attacker: sent" "$dir/attacker" 2>/dev/null && break; sleep 0.02; done
    }
    AFTER_CHIEF=attack start_cluster 3 collectives
    pids+=("$attacker")
    peak_kb=0
    while kill -0 "${pids[0]}" 2>/dev/null; do
      kb=$(awk '/^VmHWM:/ {print $2}' "/proc/${pids[0]}/status" 2>/dev/null || true)
      for c in $(pgrep -P "${pids[0]}" 2>/dev/null); do  # timeout(1) runs the worker as its child
        kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$c/status" 2>/dev/null || echo 0)
      done
      [ -n "$kb" ] && [ "$kb" -gt "$peak_kb" ] && peak_kb=$kb
      sleep 0.02
    done
    wait_all 3; wait "$attacker" || fail "the attacker did not run: $(cat "$dir/attacker")"
    grep -q "attacker: sent" "$dir/attacker" || fail "the attacker sent nothing"
    expect_cluster 3 3
    echo "the chief's peak resident memory: $peak_kb kB"
    [ "$peak_kb" -gt 0 ] && [ "$peak_kb" -lt 65536 ] || fail "the chief's peak resident memory was $peak_kb kB"
    if [ "$scenario" = stranger-basp-header-plain ]; then
      grep -q "troupe: control plane: closed the connection from 127.0.0.1:[0-9]*: a message header declares 4294967295 bytes, at most [0-9]* accepted" \
        "$dir/out0" || fail "the chief did not log the oversized header with the stranger's address"
    else
      grep -q "troupe: control plane: refused the connection from 127.0.0.1:[0-9]*: its TLS handshake failed" \
        "$dir/out0" || fail "the chief did not log the failed handshake with the stranger's address"
    fi ;;
  stranger-idle-rendezvous)
    # With a token, 28 connections that never begin their TLS handshake are opened on the chief's
    # control port between its start and the others' and held for 30 s. The cluster forms and
    # computes without waiting for them (every handshake has its deadline, and none holds up
    # another), the chief refuses each one at its deadline, and no worker, whose token is right,
    # is told that its own handshake failed.
    for i in 0 1 2; do declare "W${i}_ENV=TROUPE_CLUSTER_TOKEN=secret-$$"; done
    hold_idle() {
      "$(dirname "$0")/attacker.py" idle 127.0.0.1 "${ports[0]}" 28 30 > "$dir/attacker" 2>&1 &
      attacker=$!
      for _ in $(seq 1 300); do grep -q "attacker: holding" "$dir/attacker" 2>/dev/null && break; sleep 0.02; done
      held_at=$(now_ms)
    }
    AFTER_CHIEF=hold_idle start_cluster 3 collectives
    pids+=("$attacker")
    wait_all 3
    took=$(( $(now_ms) - held_at ))
    grep -q "attacker: holding 28 idle connections" "$dir/attacker" ||
      fail "the attacker did not hold its connections: $(cat "$dir/attacker")"
    expect_cluster 3 3
    echo "the cluster formed and computed $took ms after the 28 idle connections were opened"
    # The deadline is 5 s; a start that waited for the idle connections would end after 30 s.
    [ "$took" -lt 20000 ] || fail "the cluster took $took ms beside 28 idle connections"
    grep -q "troupe: control plane: refused the connection from 127.0.0.1:[0-9]*: its TLS handshake did not finish within 5000 ms" \
      "$dir/out0" || fail "the chief did not refuse the idle connections at their deadline"
    if grep -q "TLS handshake" "$dir/out1" "$dir/out2"; then fail "a worker with the right token was told of a failed handshake"; fi ;;
  stranger-other-user)
    # Without a token, on loopback: a stranger running as another user (nobody) is refused by
    # the chief's gate before one BASP byte, and logged with its address and user; the cluster
    # forms and computes. Needs root to run the stranger as nobody.
    if [ "$(id -u)" != 0 ] || ! command -v setpriv > /dev/null; then
      echo "SKIPPED: running a stranger as another user needs root and setpriv"; exit 77
    fi
    other_user() {
      timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \
        "$attacker_bin" bad-join 127.0.0.1 "${ports[0]}" 1 > "$dir/attacker" 2>&1 &
      attacker=$!
      for _ in $(seq 1 500); do grep -q "refused the connection from" "$dir/out0" 2>/dev/null && break; sleep 0.02; done
    }
    AFTER_CHIEF=other_user start_cluster 3 collectives
    wait_all 3; kill "$attacker" 2>/dev/null; wait "$attacker" 2>/dev/null
    grep -q "troupe: control plane: refused the connection from 127.0.0.1:[0-9]*: it belongs to user 65534, this process to user 0" \
      "$dir/out0" || fail "the chief did not refuse and log the other user's connection"
    if grep -q "attacker: connected" "$dir/attacker"; then fail "the other user reached the chief's agent"; fi
    expect_cluster 3 3 ;;
  control-key-in-memory)
    # With a token, the control plane's TLS key lives in a sealed memory file: while the cluster
    # watches, every worker holds it (memfd:troupe-control-key) and no file of it exists in
    # TMPDIR, or anywhere a worker has open.
    mkdir "$dir/tmp"
    for i in 0 1 2; do declare "W${i}_ENV=TROUPE_CLUSTER_TOKEN=secret-$$ TMPDIR=$dir/tmp MW_IDLE_MS=3000"; done
    start_cluster 3 idle
    for i in 0 1 2; do
      held=""
      for _ in $(seq 1 600); do
        c=$(pgrep -P "${pids[$i]}" | head -1)
        if [ -n "$c" ] && ls -l "/proc/$c/fd" 2>/dev/null | grep -q "memfd:troupe-control-key"; then held=$c; break; fi
        sleep 0.02
      done
      [ -n "$held" ] || fail "worker $i never held its key in a memory file"
      files=$(ls -l "/proc/$held/fd" 2>/dev/null | awk '{print $NF}' | grep -E "^/" | grep -v "^/dev/\|^/proc/" || true)
      [ -z "$files" ] || [ -z "$(echo "$files" | grep -E "$dir/tmp|troupe-control|\.pem")" ] ||
        fail "worker $i holds a key file open: $files"
    done
    [ -z "$(find "$dir/tmp" -mindepth 1)" ] || fail "a key file exists while the cluster runs: $(find "$dir/tmp" -mindepth 1)"
    wait_all 3; expect_cluster 3 3
    [ -z "$(find "$dir/tmp" -mindepth 1)" ] || fail "a key file was left behind: $(find "$dir/tmp" -mindepth 1)" ;;
  device-mismatch)
    W0_ENV="TROUPE_DEVICES_PER_WORKER=1" W1_ENV="TROUPE_DEVICES_PER_WORKER=2" start_cluster 2 join
    wait_all 2; expect_all 2 3 "workers have different device counts" ;;
  missing-worker)
    read -r -a ports <<< "$(free_ports 2)"
    TF_CONFIG="{\"cluster\": {\"worker\": [\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
      TROUPE_START_TIMEOUT_MS=1500 timeout 60 "$worker" join > "$dir/out0" 2>&1
    echo $? > "$dir/rc0"
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
    base=$(consecutive_ports 2) || fail "no free ports"
    for i in 0 1; do
      env SLURM_PROCID=$i SLURM_NTASKS=2 SLURM_JOB_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=2 \
          MW_RESOLVER=slurm MW_PORT_BASE="$base" TROUPE_DEVICES_PER_WORKER=2 \
          timeout 60 "$worker" collectives > "$dir/out$i" 2>&1 &
      pids+=($!)
    done
    wait_all 2; expect_cluster 2 4 ;;
  mpi-2x1)
    # MpiClusterResolver under Open MPI's mpirun: ranks from OMPI_COMM_WORLD_*, the coordinator
    # from TROUPE_COORDINATOR, every other address learnt at rendezvous.
    command -v mpirun >/dev/null || fail "mpirun is not installed (tools/install-deps.sh installs openmpi-bin)"
    read -r -a ports <<< "$(free_ports 1)"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=false \
      timeout 90 mpirun -n 2 --oversubscribe --output-filename "$dir/mpi" \
        -x TROUPE_COORDINATOR="127.0.0.1:${ports[0]}" -x MW_RESOLVER=mpi \
        "$worker" collectives > "$dir/mpirun.log" 2>&1
    rc=$?
    for i in 0 1; do cat "$dir"/mpi/1/rank.$i/stdout "$dir"/mpi/1/rank.$i/stderr > "$dir/out$i" 2>/dev/null; echo 0 > "$dir/rc$i"; done
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
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
[ -n "${MW_SHOW:-}" ] && for f in "$dir"/out*; do echo "--- $f"; cat "$f"; done
echo "PASSED $scenario"
