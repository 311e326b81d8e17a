#!/usr/bin/env bash
# Actors an application spawns, as real processes on loopback: two troupe-worker daemons with the
# module of actor types (tests/cluster/actor_types.cpp) and a spawner, actor_chief, as the chief.
# Every process runs under timeout in a process group of its own, killed on exit.
#   run_actors.sh SCENARIO BUILD_DIR
# Scenarios:
#   spawn         an actor on worker 1 and one in the spawner's process: requests and responses
#                 with tensors (1 MiB bit for bit), a one-way send, the actor's own error, a
#                 timeout, the size bound; an unknown type, a task the cluster lacks and a refused
#                 constructor are errors naming the type and the task; a stopped actor is down
#   spawn-control the same over the control plane alone (TROUPE_ACTOR_DATA_CONNECTIONS=0): no
#                 data connection is made; in `spawn` the messages go over worker 1's actor data
#                 port, which refuses a stranger's bytes there and logs it with the address
#   wrong-token   the spawner holds another token than worker 0: its spawn is an error naming the
#                 type and the task, and worker 0 logs the refused handshake with the address
#   host-killed   worker 1 SIGKILLed while its actor answers a request: the request in flight
#                 ends as down, the spawner's down notice names the task and the closed
#                 connection, requests to it fail, worker 0's actor answers on
#   host-stopped  worker 1 SIGSTOPped (its connection stays open): the notice comes from the
#                 heartbeats (200 ms x 3), naming the silence, and ends the request in flight
#   spawner-gone  the spawner SIGKILLed while its actor runs on worker 0: worker 0 stops it
#   any           "any" placement: the least-loaded worker (ties by index), a stopped actor no
#                 longer counts, an unknown job and type are errors, and with worker 0 SIGKILLed
#                 "any" places on worker 1
#   restart       a supervised actor (1 restart a minute) on worker 1, SIGKILLed: it answers again
#                 from worker 0 through the same handle; worker 0 SIGKILLed too: over the budget,
#                 the handle's calls are ActorRestartsExhausted
#   restart-stop  a supervised actor whose restart takes 1 s (a slow constructor), its host
#                 SIGKILLed, then stop() during the restart: the new actor is stopped (or none is
#                 made), the handle says "stopped by its spawner", nothing of it runs on worker 0
#   late-task     worker 1 not started: a spawn there gives up after TROUPE_START_TIMEOUT_MS
#                 (2 s) naming the task, one on worker 0 succeeds; then a spawn on worker 1 begun
#                 before worker 1 starts succeeds once it listens
#   flood         a stranger without the token (actor_stranger) floods worker 0 for 5 s with plain
#                 BASP spawns and pings, random bytes and a header declaring 4 GiB: worker 0 refuses
#                 and logs them, stays up, and the spawner's spawns and requests there succeed
#                 during the flood and after; an over-size message is refused by name
#   every-role    actor_chief in every role: its workers serve under serve_if_worker_or_ps, take the
#                 chief's spawns as its arrival, and exit 0 once the chief (a spawner only) left
set -uo pipefail
scenario="$1"
build="$2"
daemon="$build/tools/troupe-worker"
chief_bin="$build/tests/cluster/actor_chief"
stranger_bin="$build/tests/cluster/actor_stranger"
module="$build/tests/cluster/libtroupe_actor_types.so"
dir="$(mktemp -d)"
pids=()
source "$(dirname "$0")/../lib/cluster_common.sh"
cleanup() {
  for p in "${pids[@]}"; do kill -CONT -- "-$p" 2>/dev/null; kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $scenario: $*"
  for f in "$dir"/*.log; do echo "--- $(basename "$f")"; tail -n 40 "$f"; done
  exit 1
}
wait_for() {  # FILE REGEX SECONDS
  wait_for_line "$1" "$2" "$3" -E || fail "no line matching '$2' in $(basename "$1") within $3 s"
}
host=127.0.0.1
pick_ports() { read -r p0 p1 p2 <<< "$(free_ports 3)"; }
cluster() { echo "{\"chief\": [\"$host:$p2\"], \"worker\": [\"$host:$p0\", \"$host:$p1\"]}"; }
# launch_daemon INDEX [TOKEN]: troupe-worker as worker INDEX with the module.
launch_daemon() {
  : >"$dir/w$1.log"  # emptied now: a check right after must not read an earlier start's lines
  timeout -k 5 90 env ${2:+TROUPE_CLUSTER_TOKEN="$2"} TROUPE_TEST_TASK_INDEX="$1" "$daemon" --task "worker:$1" \
    --cluster "$(cluster)" --module "$module" >"$dir/w$1.log" 2>&1 &
  pids+=($!)
  eval "pid_w$1=$!"
}
# start_daemons TOKEN0 TOKEN1: both daemons ready (again on fresh ports when one was taken).
launch_named() { launch_daemon "${1#w}" "${daemon_token[${1#w}]}"; }
daemon_ready() { grep -q '^troupe-worker: ready ' "$dir/$1.log" 2>/dev/null; }
start_daemons() {
  daemon_token=("$1" "$2")
  pick_ports
  start_listening daemon_ready launch_named w0 w1
  for n in w0 w1; do daemon_ready "$n" || fail "$n ended before it was ready"; done
}
# chief MODE [TOKEN]: actor_chief in the background as the chief; a host silent for 3 heartbeats
# of 200 ms is lost, or for MISSED of them.
chief() {
  : >"$dir/chief.log"
  timeout -k 5 60 env ${2:+TROUPE_CLUSTER_TOKEN="$2"} ${ACTOR_DATA:+TROUPE_ACTOR_DATA_CONNECTIONS="$ACTOR_DATA"} TROUPE_HEARTBEAT_MS=200 TROUPE_MISSED_HEARTBEATS="${MISSED:-3}" TROUPE_START_TIMEOUT_MS="${start_ms:-10000}" \
    TF_CONFIG="{\"cluster\": $(cluster), \"task\": {\"type\": \"chief\", \"index\": 0}}" \
    "$chief_bin" --mode "$1" --module "$module" >"$dir/chief.log" 2>&1 &
  pids+=($!)
  pid_chief=$!
}
chief_status() {
  wait "$pid_chief"
  st=$?
}
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

case "$scenario" in
  spawn|spawn-control)
    start_daemons "$token" "$token"
    [[ $scenario == spawn-control ]] && ACTOR_DATA=0
    chief spawn "$token"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS spawn' "$dir/chief.log" || fail "no PASS line"
    grep -q "(functions: none; actor types: accumulator)" "$dir/w1.log" || fail "the ready line lacks the module's actor types"
    grep -q "spawned actor 'accumulator' for '/job:chief/replica:0/task:0'" "$dir/w1.log" || fail "worker 1 did not log the spawn"
    # The spawner ended: the daemons stop what it left on them.
    wait_for "$dir/w1.log" "the actor spawner '/job:chief/replica:0/task:0' is gone: stopping its 1 actor" 10
    if [[ $scenario == spawn-control ]]; then
      grep -q "connected to the actor data port" "$dir/w1.log" && fail "a data connection was made with TROUPE_ACTOR_DATA_CONNECTIONS=0"
    else
      grep -q "an actor spawner connected to the actor data port (the data connection from 127.0.0.1:" "$dir/w1.log" ||
        fail "the spawner's messages did not go over worker 1's actor data port"
      port=$(grep -Eo "actor data port 127\.0\.0\.1:[0-9]+" "$dir/w1.log" | head -n 1 | sed -E 's/.*://')
      [[ -n "$port" ]] || fail "worker 1 did not log its actor data port"
      # A stranger's bytes there (no proof, no secret): refused and logged with its address.
      exec 3<>"/dev/tcp/127.0.0.1/$port" || fail "cannot reach the actor data port $port"
      printf 'amsg accumulator add %064d' 0 >&3
      exec 3>&-
      wait_for "$dir/w1.log" "task:1's actor data port refused a data connection from 127\.0\.0\.1:[0-9]+" 15
    fi
    ;;
  wrong-token)
    start_daemons "stranger-$token" "stranger-$token"
    chief refused "$token"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS refused' "$dir/chief.log" || fail "no PASS line"
    grep -q "spawned actor" "$dir/w0.log" && fail "worker 0 spawned an actor for a spawner without its token"
    grep -Eq "control plane: refused the connection from 127\.0\.0\.1:[0-9]+: its TLS handshake failed" "$dir/w0.log" ||
      fail "worker 0 did not log the refused connection with its address"
    ;;
  host-killed|host-stopped)
    start_daemons "$token" "$token"
    chief down "$token"
    wait_for "$dir/chief.log" "^spawned" 30
    wait_for "$dir/w1.log" "^accumulator 1: sleeping 30000 ms" 30  # a request in flight
    child=$(pgrep -P "$pid_w1")
    if [[ $scenario == host-killed ]]; then kill -KILL "$child"; else kill -STOP "$child"; fi
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS down' "$dir/chief.log" || fail "no PASS line"
    if [[ $scenario == host-killed ]]; then
      grep -q "^cause: the connection to /job:worker/replica:0/task:1 closed" "$dir/chief.log" || fail "the cause is not the closed connection"
    else
      grep -Eq "^cause: /job:worker/replica:0/task:1 answered no heartbeat for [0-9]+ ms \(3 x 200 ms" "$dir/chief.log" ||
        fail "the cause is not the missed heartbeats"
      kill -CONT "$child"
    fi
    ;;
  any)
    start_daemons "$token" "$token"
    chief any "$token"
    wait_for "$dir/chief.log" "^placed" 30
    kill -KILL "$(pgrep -P "$pid_w0")"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS any' "$dir/chief.log" || fail "no PASS line"
    ;;
  restart)
    start_daemons "$token" "$token"
    chief restart "$token"
    wait_for "$dir/chief.log" "^spawned" 30
    kill -KILL "$(pgrep -P "$pid_w1")"
    wait_for "$dir/chief.log" "^restarted" 30
    kill -KILL "$(pgrep -P "$pid_w0")"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS restart' "$dir/chief.log" || fail "no PASS line"
    grep -q "restarted actor 'accumulator' #2 on /job:worker/replica:0/task:1 as #3 on /job:worker/replica:0/task:0" "$dir/chief.log" ||
      fail "the spawner did not log the restart"
    ;;
  restart-stop)
    start_daemons "$token" "$token"
    chief restart-stop "$token"
    wait_for "$dir/chief.log" "^spawned" 30
    kill -KILL "$(pgrep -P "$pid_w1")"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS restart-stop' "$dir/chief.log" || fail "no PASS line"
    ;;
  late-task)
    daemon_token=("$token" "$token")
    # Worker 1 comes up late, on a port the spawner and worker 0 already have: when another
    # process took it, the whole cluster starts again on fresh ports (start_late).
    late_task_start() {
      pick_ports
      start_listening daemon_ready launch_named w0
      daemon_ready w0 || fail "w0 ended before it was ready"
      start_ms=2000 chief never "$token"
      chief_status
      [[ $st == 0 ]] || fail "the spawner (never) exited $st"
      grep -q '^PASS never' "$dir/chief.log" || fail "no PASS never line"
      mv "$dir/chief.log" "$dir/chief-never.log"
      chief late "$token"
      wait_for "$dir/chief.log" "^spawning" 30
      sleep 1
      launch_named w1
    }
    start_late daemon_ready w1 late_task_start
    chief_status
    [[ $st == 0 ]] || fail "the spawner (late) exited $st"
    grep -q '^PASS late' "$dir/chief.log" || fail "no PASS late line"
    grep -q '^troupe-worker: ready ' "$dir/w1.log" || fail "worker 1 did not start"
    ;;
  flood)
    start_daemons "$token" "$token"
    timeout -k 5 60 "$stranger_bin" "$p0" 5 >"$dir/stranger.log" 2>&1 &
    pids+=($!)
    pid_stranger=$!
    wait_for "$dir/stranger.log" "^stranger: flooding" 20
    # Worker 0 refuses the flood and answers the spawner meanwhile; on a loaded machine its
    # heartbeat answers were seen 737 ms late, past 3 x 200 ms, and the spawner took it for lost
    # (its actor down, the request in flight failed). Liveness is not what this checks: a host
    # silent for 4 s (20 x 200 ms) is still lost.
    MISSED=20 chief flood "$token"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS flood' "$dir/chief.log" || fail "no PASS line"
    wait "$pid_stranger" || fail "the stranger exited $?"
    line=$(grep '^stranger: basp=' "$dir/stranger.log") || fail "the stranger did not finish"
    basp=$(sed -E 's/.*basp=([0-9]+).*/\1/' <<<"$line")
    accepted=$(sed -E 's/.*accepted=([0-9]+).*/\1/' <<<"$line")
    closed=$(sed -E 's/.*closed=([0-9]+).*/\1/' <<<"$line")
    [[ $accepted == 0 ]] || fail "worker 0 answered $accepted spawn(s) or ping(s) of a stranger"
    [[ $basp -ge 2 && $closed -ge 2 ]] || fail "the flood was too small to say anything: $line"
    kill -0 "$(pgrep -P "$pid_w0")" 2>/dev/null || fail "worker 0 did not stay up"
    grep -q "spawned actor" "$dir/w0.log" || fail "worker 0 spawned nothing for the token holder"
    # The gate logs the 1st, 2nd, 4th, ... refusal with the count so far: at least every BASP try.
    most=$(grep -Eo "control plane: refused the connection from 127\.0\.0\.1:[0-9]+: .* \(([0-9]+) refused so far\)" "$dir/w0.log" |
           sed -E 's/.*\(([0-9]+) refused so far\)/\1/' | sort -n | tail -n 1)
    [[ -n "$most" ]] || fail "worker 0 logged no refused connection"
    pow=1
    while (( pow * 2 <= basp + closed )); do pow=$((pow * 2)); done
    [[ $most -ge $pow ]] || fail "worker 0 logged $most refusals for $basp BASP tries and $closed closed raw connections"
    echo "$line; worker 0 logged refusals up to $most"
    ;;
  spawner-gone)
    start_daemons "$token" "$token"
    chief orphan "$token"
    wait_for "$dir/chief.log" "^spawned" 30
    kill -KILL "$(pgrep -P "$pid_chief")"
    wait_for "$dir/w0.log" "the actor spawner '/job:chief/replica:0/task:0' is gone: stopping its 1 actor" 15
    ;;
  every-role)
    launch_role() {
      local i="${1#w}"
      timeout -k 5 60 env TROUPE_CLUSTER_TOKEN="$token" TROUPE_START_TIMEOUT_MS=20000 TROUPE_TEST_TASK_INDEX="$i" \
        TF_CONFIG="{\"cluster\": $(cluster), \"task\": {\"type\": \"worker\", \"index\": $i}}" \
        "$chief_bin" --mode every-role --module "$module" >"$dir/w$i.log" 2>&1 &
      pids+=($!)
      eval "pid_w$i=$!"
    }
    # Both listen (read from /proc without connecting: a probe would be a refused stranger).
    role_listens() {
      local p port="$p1"
      eval "p=\$pid_$1"
      [[ $1 == w0 ]] && port="$p0"
      listens "$p" "$port"
    }
    pick_ports
    start_listening role_listens launch_role w0 w1
    for n in w0 w1; do role_listens "$n" || fail "$n ended before it listened"; done
    chief every-role "$token"
    chief_status
    [[ $st == 0 ]] || fail "the spawner exited $st"
    grep -q '^PASS every-role' "$dir/chief.log" || fail "no PASS line"
    for i in 0 1; do
      eval "p=\$pid_w$i"
      wait "$p"
      st=$?
      [[ $st == 0 ]] || fail "worker $i exited $st after its chief left (expected 0)"
      grep -q "^served until the chief left" "$dir/w$i.log" || fail "worker $i did not serve until its chief left"
    done
    ;;
  *) fail "unknown scenario" ;;
esac
echo "PASS $scenario"
