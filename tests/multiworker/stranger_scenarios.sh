# The scenarios of run_cluster.sh where a stranger, a forger or a wrong token meets a cluster of
# workers (sourced by run_cluster.sh, whose helpers they use; run them through it).

# stranger_attack MODE: worker 1 starts alone; ring_stranger finds its ring port and attacks it
# during start-up; worker 0 starts once the stranger is in. The stranger must be refused and
# logged by worker 1 (naming the stranger's address), the cluster must form and compute the
# right values, and no worker may fail or be blamed.
stranger_attack() {
  local mode="$1" attempt list w1 s
  for attempt in 1 2 3; do
    cluster_n=2; pick_ports
    list="\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\""
    env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": 1}}" \
        timeout 60 "$worker" collectives > "$dir/out1" 2>&1 &
    w1=$!
    timeout 40 "$stranger" "$mode" "$w1" > "$dir/stranger" 2>&1 &
    s=$!
    pids=("" "$w1" "$s")
    for _ in $(seq 200); do grep -q "^attacking" "$dir/stranger" && break; sleep 0.05; done
    grep -q "^attacking" "$dir/stranger" || fail "the stranger did not get in: $(cat "$dir/stranger")"
    # The ring listens on the address TF_CONFIG gives, not on every interface.
    grep -q "^attacking [0-9]* bound to 127.0.0.1$" "$dir/stranger" ||
      fail "worker 1's ring port is not bound to its TF_CONFIG address: $(cat "$dir/stranger")"
    env TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
        timeout 60 "$worker" collectives > "$dir/out0" 2>&1 &
    pids[0]=$!; pid_0=$!
    # Worker 0, the chief, listens on its port, or another process took it: then everything
    # starts again on fresh ports.
    ready_or_ended chief_listens 0 $((SECONDS + 20))
    port_taken 0 || break
    echo "a port was taken (attempt $attempt, task 0): $(grep -h 'cannot listen' "$dir/out0" | head -n 1)"
    kill_tasks; wait "${pids[@]}" 2>/dev/null
    [ "$attempt" = 3 ] && fail "no free ports after 3 tries"
  done
  wait_all 2
  wait "$s"; local src=$?
  cat "$dir/stranger" >> "$dir/out1"
  expect_cluster 2 2
  [ "$src" = 0 ] || fail "the stranger's connections were not closed by worker 1 (exit $src)"
  grep -q "troupe: ring rank 1 refused a connection from 127.0.0.1:" "$dir/out1" ||
    fail "worker 1 did not log the refused stranger with its address"
  if grep -q "ERROR\|cross-worker collective failed" "$dir"/out0 "$dir"/out1; then fail "a worker was blamed"; fi
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
    pick_cfg() {
      read -r -a ports <<< "$(free_ports 1)"
      cfg="{\"cluster\": {\"worker\": [\"127.0.0.1:${ports[0]}\", \"192.0.2.1:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}"
    }
    pick_cfg
    env -u TROUPE_CLUSTER_TOKEN TF_CONFIG="$cfg" timeout 60 "$worker" join > "$dir/out0" 2>&1; echo $? > "$dir/rc0"
    expect_all 1 3 "spans more than loopback (192.0.2.1:2222) and no cluster token is set.*TROUPE_CLUSTER_TOKEN.*TROUPE_INSECURE=1"
    insecure() {  # this one listens: again on a fresh port when another process took it
      pick_cfg
      env -u TROUPE_CLUSTER_TOKEN TROUPE_INSECURE=1 TROUPE_START_TIMEOUT_MS=1000 TF_CONFIG="$cfg" timeout 60 "$worker" join \
        > "$dir/out0" 2>&1; echo $? > "$dir/rc0"
    }
    retry_if_taken "$dir/out0" insecure
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
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
