# The scenarios of run_cluster.sh where a stranger, an impostor or a wrong token meets a cluster of
# tasks (sourced by run_cluster.sh, whose helpers they use; run them through it).
# Scenarios:
#   wrong-token    a daemon with another token is refused (logged with the address) and the cluster
#                  goes on without it: the failed handshakes break none of the good connections
#   ps-idle-flood  the bulk checks, with a token, while 80 idle connections are held on a ps task's
#                  data port: the oldest unproven ones make room, the workers' own get in
#   ckpt-stranger  a stranger on loopback sends the ps task the checkpoint messages only the chief
#                  may send (no hello, a worker's hello, paths with "..", strings of 16 MiB) while
#                  ps_trainer fit saves checkpoints: each refused and logged, nothing written
#                  outside the checkpoint directory, the training and its checkpoints unharmed
#   ckpt-stranger-token  the same with a cluster token: the stranger cannot connect at all
#   chief-impostor-first  the same impostor reaches the ps task before the chief and stays (beating
#                  as a chief does): the chief's hellos are refused, and its start fails at its ps
#                  timeout naming the refusal (not the token); the ps task logs the refused hello
#                  with its address
#   idle-term      with a token, one connection that never starts its TLS handshake held on each
#                  daemon's control port: SIGTERM, sent within the handshake's deadline, still
#                  stops each daemon cleanly (exit 0) and promptly
#   chief-impostor a process with the cluster token says hello to the ps task as the chief while
#                  the real chief trains (with checkpoints), sends a checkpoint save and leaves: both
#                  refused and logged with its address; the training, its checkpoints and the ps
#                  task (which ends with its chief, not the impostor) unharmed
case "$scenario" in
  wrong-token)
    good=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    token_w0="$good" token_w1="stranger-$good" token_ps="$good"
    start_daemons
    # The result on stdout, the log on stderr: apart, so that a log line cannot split the result.
    # About a second of work, so that the chief's retries (every 200 ms) fail several handshakes
    # while its connections to worker 0 and the ps task carry the closures: none may break.
    TROUPE_CLUSTER_TOKEN="$good" TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode retry \
      --closures 200 --slow-ms 5 >"$dir/chief.log" 2>"$dir/chief-stderr.log"
    st=$?
    [[ $st == 0 ]] || fail "the chief exited $st"
    grep -q "result: closures=200 done=200 " "$dir/chief.log" || fail "not every closure was done"
    grep -q "result: .* workers_lost=0" "$dir/chief.log" || fail "a good worker was lost beside the refused one"
    grep -q "cannot reach /job:worker/replica:0/task:1" "$dir/chief-stderr.log" || fail "the chief did not log the refused worker"
    grep -q "connected" "$dir/w1.log" && fail "the worker with the wrong token was heard"
    grep -Eq "control plane: refused the connection from 127\.0\.0\.1:[0-9]+: its TLS handshake failed" "$dir/w1.log" ||
      fail "the worker with the wrong token did not log the refused connection with its address"
    grep -q "connected /job:chief/replica:0/task:0" "$dir/w0.log" || fail "worker 0 did not serve the chief"
    ;;
  ps-idle-flood)
    # 80 plain TCP connections held idle on a ps task's data port (more than the 64 it lets prove
    # themselves at once), with a token: the workers' own data connections still get in and every
    # read and update of the bulk checks passes.
    good=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    nps=2
    token_w0="$good" token_w1="$good" token_ps="$good" token_ps1="$good"
    start_daemons w0 w1 ps ps1
    wait_for "$dir/ps.log" "variables' data port 127.0.0.1:[0-9]+" 20
    data_port=$(grep -Eo "variables' data port 127.0.0.1:[0-9]+" "$dir/ps.log" | head -n 1 | cut -d: -f2)
    timeout 60 python3 - "$data_port" >"$dir/flood.log" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(80)]
print("holding", len(held), flush=True)
time.sleep(40)
PY
    flood=$!
    pids+=($flood)
    wait_for "$dir/flood.log" '^holding 80' 20
    TROUPE_CLUSTER_TOKEN="$good" TF_CONFIG="$(tf_config chief 0)" timeout -k 5 60 "$chief_bin" --mode bulk \
      >"$dir/chief.log" 2>&1
    st=$?
    kill "$flood" 2>/dev/null
    [[ $st == 0 ]] || fail "the chief exited $st while 80 idle connections were held on the ps task's data port"
    [[ "$(grep -c '^PASS' "$dir/chief.log")" == 2 ]] || fail "not every check of the chief passed"
    grep -q "pushed out by newer connections before it proved itself" "$dir/ps.log" ||
      fail "the ps task did not log the idle connections it pushed out"
    ;;
  silent-ps)
    # A "ps task" that accepts connections and never says a word: the chief gives up within its
    # start timeout (each connect bounded), naming the ps task, instead of waiting forever.
    launch_silent() {
      timeout 60 python3 - "$p2" >"$dir/$1.log" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    sys.exit(f"cannot listen on 127.0.0.1:{sys.argv[1]}: {e}")
s.listen(16)
print("listening", flush=True)
held = []
s.settimeout(1)
end = time.time() + 50
while time.time() < end:
    try:
        held.append(s.accept()[0])
    except socket.timeout:
        pass
PY
      pids+=($!)
      eval "pid_$1=$!"
    }
    silent_ready() { grep -q '^listening' "$dir/$1.log" 2>/dev/null; }
    start_listening silent_ready launch_silent silent
    silent_ready silent || fail "the silent ps task ended before it listened"
    began=$SECONDS
    TF_CONFIG="$(tf_config chief 0)" TROUPE_START_TIMEOUT_MS=2000 timeout -k 5 40 "$trainer" --closures 10 >"$dir/chief.log" 2>&1
    st=$?
    took=$((SECONDS - began))
    ! timed_out "$st" || fail "the chief hung on a ps task that never answers"
    [[ $st != 0 ]] || fail "the chief exited 0 without its ps task"
    grep -q "cannot reach ps task /job:ps/replica:0/task:0 at 127.0.0.1:$p2 within 2000 ms" "$dir/chief.log" ||
      fail "the chief's error does not name the silent ps task"
    echo "the chief gave up on the silent ps task after about $took s"
    ;;
  ckpt-stranger|ckpt-stranger-token)
    # A stranger reaches the ps task while ps_trainer's chief trains and saves sharded checkpoints,
    # and sends it the checkpoint messages only that chief may send (ckpt_stranger.cpp lists them:
    # with and without a hello, paths that climb out of the checkpoint directory, strings of
    # 16 MiB). Without a token each is refused and the ps task logs it (bounded: at powers of two),
    # with a token the stranger cannot even connect; either way no file appears outside the
    # checkpoint directory and the chief's training and checkpoints go on unharmed.
    ckdir="$dir/ckpt"
    if [[ $scenario == ckpt-stranger-token ]]; then
      TROUPE_CLUSTER_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
      export TROUPE_CLUSTER_TOKEN
    fi
    args=(--closures 400 --step-delay-ms 30 --checkpoint-dir "$ckdir" --checkpoint-every 100)
    start_tasks "${args[@]}"
    start chief chief 0 "$trainer" "${args[@]}"
    wait_for "$dir/chief.log" "^closures [0-9]+/400 done" 30  # mid-training
    timeout 60 "$build/tests/cluster/ckpt_stranger" 127.0.0.1 "$p2" "$ckdir" >"$dir/stranger.log" 2>&1
    stranger_st=$?
    chief_proc=$(pgrep -P "$pid_chief") || fail "the training ended before the stranger was done: lengthen it"
    if [[ $scenario == ckpt-stranger ]]; then
      [[ $stranger_st == 0 ]] || fail "the stranger exited $stranger_st (0: every message refused)"
      grep -q "^stranger: refused 12 of 12$" "$dir/stranger.log" || fail "not every checkpoint message was refused"
      [[ $(grep -Ec "^stranger: refused: .*/job:ps/replica:0/task:0 (save|restore)s checkpoints for its chief only" \
           "$dir/stranger.log") == 12 ]] || fail "a refusal does not say that only the chief may send it"
      # Refusals 1, 2, 4 and 8 are logged, with who the sender said it was and its address.
      from="\[connected from 127\.0\.0\.1:[0-9]+\]"
      grep -Eq "refused a checkpoint save from an actor that did not say hello, which is not its chief $from \(1 refused so far\)" \
        "$dir/ps.log" || fail "the ps task did not log the first refused save with its address"
      grep -Eq "refused a checkpoint restore from an actor that did not say hello, which is not its chief $from \(2 refused so far\)" \
        "$dir/ps.log" || fail "the ps task did not log the refused restore"
      grep -Eq "refused a checkpoint save from '/job:worker/replica:0/task:7', which is not its chief $from \(4 refused so far\)" \
        "$dir/ps.log" || fail "the ps task did not name the worker the stranger said it was"
      grep -Eq "refused a checkpoint (save|restore) from .* \(8 refused so far\)" "$dir/ps.log" ||
        fail "the ps task did not log the 8th refusal"
      [[ $(grep -c "refused a checkpoint" "$dir/ps.log") == 4 ]] || fail "the refusals were not logged at powers of two only"
    else
      [[ $stranger_st == 2 ]] || fail "the stranger without the token exited $stranger_st (2: it could not connect)"
      grep -q "^stranger: unreachable: " "$dir/stranger.log" || fail "the stranger without the token reached the ps task"
      grep -Eq "control plane: refused the connection from 127\.0\.0\.1:[0-9]+: its TLS handshake failed" "$dir/ps.log" ||
        fail "the ps task did not log the stranger's refused connection with its address"
      ! grep -q "refused a checkpoint" "$dir/ps.log" || fail "a checkpoint message got past the token"
    fi
    status_of "$pid_chief"
    [[ $st == 0 ]] || fail "the chief exited $st"
    check_training "$dir/chief.log" 400 0
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"; [[ $st == 0 ]] || fail "$n exited $st after its chief left"
    done
    # Nothing written outside the checkpoint directory. The chief saved at every 100th step's
    # closure boundary and at step 400, the stranger's attempts in between; the newest three (it
    # keeps three) are whole.
    escaped=$(find "$dir" /tmp -maxdepth 2 -name 'escaped*' -newer "$dir/ps.log" 2>/dev/null)
    [[ -z "$escaped" ]] || fail "the stranger wrote $escaped"
    [[ "$(cd "$dir" && ls -d -- * | grep -v '\.log$')" == ckpt ]] || fail "$dir holds more than the logs and ckpt: $(ls "$dir")"
    [[ -z "$(find "$ckdir" -name 'ckpt-999*')" ]] || fail "the stranger's save in progress reached $ckdir"
    saved=$(sed -n "s|.* saved .* to $ckdir/ckpt-\([0-9]*\)\.tmp-.*|\1|p" "$dir/ps.log")
    [[ $(echo "$saved" | wc -w) -ge 4 && $(echo "$saved" | tail -n 1) == 400 ]] ||
      fail "the chief's saves were at steps $(echo $saved), expected 4 ending at 400"
    "$build/tools/troupe-ckpt" "$ckdir" >"$dir/ckpt-list.log" 2>&1 || fail "troupe-ckpt exited $? on the checkpoints"
    grep -q ": 3 sharded checkpoints, oldest first" "$dir/ckpt-list.log" || fail "troupe-ckpt did not list 3 checkpoints"
    for step in $(echo "$saved" | tail -n 3); do
      grep -Eq "^  ckpt-$step/ +step $step, .*intact$" "$dir/ckpt-list.log" || fail "checkpoint $step is not listed intact"
    done
    cat "$dir/stranger.log"
    grep "refused a checkpoint\|refused the connection" "$dir/ps.log" | head -n 5
    ;;
  idle-term)
    # A session still in its TLS handshake is closed as the process stops: it never holds the exit.
    tok=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    token_w0="$tok" token_w1="$tok" token_ps="$tok"
    start_daemons
    for n in w0 w1 ps; do
      read -r -a t <<< "$(task_of "$n")"
      "$(dirname "$0")/../multiworker/attacker.py" idle 127.0.0.1 "${t[2]}" 1 60 >"$dir/idle-$n.log" 2>&1 &
      pids+=($!)
    done
    for n in w0 w1 ps; do wait_for "$dir/idle-$n.log" "attacker: holding" 20; done
    # All at once, well within the handshake's 5 s deadline: a stop that waited for the idle
    # session would take until the deadline, or (before it had one) 30 s and exit 1.
    began=$SECONDS
    for n in w0 w1 ps; do eval "term_task \$pid_$n"; done
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"
      [[ $st == 0 ]] || fail "$n exited $st on SIGTERM beside an idle connection (expected 0)"
    done
    took=$((SECONDS - began))
    [[ $took -lt 15 ]] || fail "the daemons took $took s to stop beside idle connections"
    ! grep -q "still runs" "$dir/w0.log" "$dir/w1.log" "$dir/ps.log" || fail "a daemon blamed a function for its stop"
    echo "the daemons stopped within $took s of SIGTERM beside an idle connection each"
    ;;
  chief-impostor-first)
    # A token holder that takes the chief's role first keeps it while it stays: the real chief is
    # refused, never given a share of it, and says why (docs/multi-worker.md: what a holder can do).
    TROUPE_CLUSTER_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    export TROUPE_CLUSTER_TOKEN
    start_tasks --closures 50
    timeout 60 "$build/tests/cluster/chief_impostor" 127.0.0.1 "$p2" "$dir/ckpt" 30 >"$dir/impostor.log" 2>&1 &
    pids+=($!)
    wait_for "$dir/impostor.log" "^impostor: holding" 20
    grep -q "^impostor: ACCEPTED: a hello as the chief" "$dir/impostor.log" ||
      fail "the first chief's hello was not taken (the ps task served no chief yet)"
    TF_CONFIG="$(tf_config chief 0)" TROUPE_START_TIMEOUT_MS=3000 timeout -k 5 40 "$trainer" --closures 50 \
      >"$dir/chief.log" 2>&1
    st=$?
    ! timed_out "$st" || fail "the refused chief hung"
    [[ $st != 0 ]] || fail "the chief exited 0 though the ps task serves another chief"
    grep -q "cannot reach ps task /job:ps/replica:0/task:0 at 127.0.0.1:$p2 within 3000 ms: .*/job:ps/replica:0/task:0 already serves '/job:chief/replica:0/task:0' from another process" \
      "$dir/chief.log" || fail "the chief's error does not name the refusal"
    ! grep -q "TROUPE_CLUSTER_TOKEN the same" "$dir/chief.log" || fail "the chief blamed the token for the refusal"
    grep -Eq "refused a hello as '/job:chief/replica:0/task:0' from another process: .* \[connected from 127\.0\.0\.1:[0-9]+\] \(1 refused so far\)" \
      "$dir/ps.log" || fail "the ps task did not log the refused chief with its address"
    kill -0 "$pid_ps" 2>/dev/null || fail "the ps task ended while its first chief still beat"
    grep "cannot reach ps task" "$dir/chief.log"
    ;;
  chief-impostor)
    # Every token holder passes the control plane's TLS, so any could say it is the chief; the ps
    # task keeps the chief's role for the first process that said so while it is connected.
    ckdir="$dir/ckpt"
    TROUPE_CLUSTER_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    export TROUPE_CLUSTER_TOKEN
    args=(--closures 400 --step-delay-ms 30 --checkpoint-dir "$ckdir" --checkpoint-every 100)
    start_tasks "${args[@]}"
    start chief chief 0 "$trainer" "${args[@]}"
    wait_for "$dir/chief.log" "^closures [0-9]+/400 done" 30  # mid-training
    wait_for "$dir/ps.log" "connected /job:chief/replica:0/task:0" 10
    timeout 60 "$build/tests/cluster/chief_impostor" 127.0.0.1 "$p2" "$ckdir" >"$dir/impostor.log" 2>&1
    impostor_st=$?
    pgrep -P "$pid_chief" >/dev/null || fail "the training ended before the impostor was done: lengthen it"
    [[ $impostor_st == 0 ]] || fail "the impostor exited $impostor_st (0: its hello and its save refused)"
    grep -q "^impostor: refused 2 of 2$" "$dir/impostor.log" || fail "the impostor was not refused twice"
    grep -q "^impostor: refused: .*/job:ps/replica:0/task:0 already serves '/job:chief/replica:0/task:0' from another process" \
      "$dir/impostor.log" || fail "the refused hello does not say that the ps task already serves its chief"
    grep -q "^impostor: refused: .*saves checkpoints for its chief only" "$dir/impostor.log" ||
      fail "the impostor's save was not refused as not the chief's"
    grep -Eq "refused a hello as '/job:chief/replica:0/task:0' from another process: '/job:chief/replica:0/task:0' holds the chief's role while it is connected \[connected from 127\.0\.0\.1:[0-9]+\] \(1 refused so far\)" \
      "$dir/ps.log" || fail "the ps task did not log the refused chief with its address"
    status_of "$pid_chief"
    [[ $st == 0 ]] || fail "the chief exited $st"
    check_training "$dir/chief.log" 400 0
    for n in w0 w1 ps; do
      eval "p=\$pid_$n"
      status_of "$p"; [[ $st == 0 ]] || fail "$n exited $st after its chief left"
    done
    saved=$(sed -n "s|.* saved .* to $ckdir/ckpt-\([0-9]*\)\.tmp-.*|\1|p" "$dir/ps.log")
    [[ $(echo "$saved" | wc -w) -ge 4 && $(echo "$saved" | tail -n 1) == 400 ]] ||
      fail "the chief's saves were at steps $(echo $saved), expected 4 ending at 400"
    [[ ! -e "$ckdir/shard-0-of-1.ckpt" ]] || fail "the impostor's save reached $ckdir"
    cat "$dir/impostor.log"
    grep "refused a hello as\|refused a checkpoint" "$dir/ps.log" | head -n 5
    ;;
  *)
    echo "run_cluster.sh: unknown scenario $scenario" >&2
    exit 2
    ;;
esac
