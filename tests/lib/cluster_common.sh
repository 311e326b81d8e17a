# What the scripts that run clusters of real processes on loopback share (sourced, not run):
# picking free ports, starting tasks again on fresh ports when one was taken before it bound,
# waiting (always bounded), and killing every task on the way out.
#
# The sourcing script provides:
#   dir          its scratch directory
#   pids         an array: every task it started (as `timeout ... PROGRAM`, whose pid leads a
#                process group of its own), killed by kill_tasks
#   fail MSG...  prints what went wrong (with the tasks' output) and exits 1
#   pick_ports   picks the cluster's ports afresh (start_listening calls it before a new try)
#   log_of NAME  (optional) the file task NAME writes its output to: "$dir/NAME.log" unless set
#
# Ports are free when they are picked, not when a task binds one: another process may take one in
# between. A task that cannot bind says "cannot listen" and ends at once; start_listening and
# retry_if_taken read that from its output (never guessing from a timing) and start again on
# fresh ports, up to 3 times.

declare -F log_of > /dev/null || log_of() { echo "$dir/$1.log"; }

# kill_task PID: SIGKILL to the process group PID leads (timeout(1)'s), or to PID alone.
kill_task() { kill -9 -- "-$1" 2>/dev/null || kill -9 "$1" 2>/dev/null; }

# kill_tasks: kill_task for every pid in pids.
kill_tasks() {
  local p
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill_task "$p"; done
}

# free_ports N: N distinct loopback ports free at this moment, on one line.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
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

# listens PID PORT: the task that timeout PID runs holds a socket listening on PORT. Read from
# /proc, not by trying to bind: what listens there may be another process that took the port.
listens() {
  local child inode
  child=$(pgrep -P "$1") || return 1
  for inode in $(awk -v port=":$(printf '%04X' "$2")" \
    '$4 == "0A" && substr($2, length($2) - 4) == port { print $10 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    ls -l "/proc/$child/fd" 2>/dev/null | grep -q "socket:\[$inode\]" && return 0
  done
  return 1
}

# port_taken NAME: task NAME said it cannot listen (another process took its port).
port_taken() { grep -q 'cannot listen' "$(log_of "$1")" 2>/dev/null; }

# ready_or_ended READY NAME DEADLINE: waits until `READY NAME` succeeds or task NAME (pid_NAME) has
# ended; fails the scenario when neither happened by DEADLINE (in $SECONDS).
ready_or_ended() {
  local p
  eval "p=\$pid_$2"
  until "$1" "$2"; do
    kill -0 "$p" 2>/dev/null || return 0
    [[ $SECONDS -ge $3 ]] && fail "task $2 is not ready within 20 s"
    sleep 0.05
  done
}

# start_listening READY LAUNCH NAME...: `LAUNCH NAME` starts each task NAME that listens on a port
# of the cluster (and sets pid_NAME); then each must be ready (`READY NAME` succeeds) or have ended
# within 20 s. A task whose port another process took says it cannot listen and ends at once; then
# all of them are killed and start again on fresh ports (pick_ports), up to 3 times. A task that
# ended for another reason is the scenario's to check.
start_listening() {
  local ready="$1" launch="$2" attempt n p deadline taken
  shift 2
  for attempt in 1 2 3; do
    for n in "$@"; do "$launch" "$n"; done
    deadline=$((SECONDS + 20))
    for n in "$@"; do ready_or_ended "$ready" "$n" "$deadline"; done
    taken=""
    for n in "$@"; do port_taken "$n" && taken+=" $n"; done
    [[ -z "$taken" ]] && return
    n=${taken# }; n=${n%% *}
    echo "a port was taken (attempt $attempt, task$taken): $(grep -h 'cannot listen' "$(log_of "$n")" | head -n 1)"
    for n in "$@"; do
      eval "p=\$pid_$n"
      kill_task "$p"
      wait "$p" 2>/dev/null
    done
    pick_ports
  done
  fail "no free ports after 3 tries"
}

# start_late READY NAME START...: runs START, which picks the cluster's ports (pick_ports) and
# starts its tasks, task NAME last (setting pid_NAME), late: on a port the tasks before it already
# know. Then NAME must be ready (`READY NAME` succeeds) or have ended within 20 s. When NAME says it
# cannot listen (another process took its port), no task can be moved to another port: every task
# is killed and START runs again, on fresh ports, up to 3 times in all. A NAME that ended for
# another reason is the scenario's to check.
start_late() {
  local ready="$1" name="$2" attempt p
  shift 2
  for attempt in 1 2 3; do
    "$@"
    ready_or_ended "$ready" "$name" $((SECONDS + 20))
    port_taken "$name" || return 0
    echo "a port was taken (attempt $attempt, task $name): $(grep -h 'cannot listen' "$(log_of "$name")" | head -n 1)"
    kill_tasks
    for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
  done
  fail "no free ports after 3 tries"
}

# retry_if_taken LOG COMMAND...: runs COMMAND, which picks its ports and runs its tasks to their
# end, again (up to 3 times in all) while LOG says a task could not listen.
retry_if_taken() {
  local log="$1" attempt
  shift
  for attempt in 1 2 3; do
    "$@"
    grep -q 'cannot listen' "$log" 2>/dev/null || return 0
    echo "a port was taken (attempt $attempt): $(grep -h 'cannot listen' "$log" | head -n 1)"
  done
  fail "no free ports after 3 tries"
}

# wait_for_line FILE PATTERN SECONDS [GREP_OPTION]: true once FILE has a line matching PATTERN
# (grep, or grep GREP_OPTION: -E), false after SECONDS.
wait_for_line() {
  local deadline=$(( $(date +%s%N) + $3 * 1000000000 ))
  until grep -q ${4:-} -- "$2" "$1" 2>/dev/null; do
    [ "$(date +%s%N)" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

now_ms() { date +%s%3N; }

# status_of PID: waits for it (bounded by the timeout it runs under) and sets $st to its status.
# Not in $(...): a subshell cannot wait for its parent's children.
status_of() {
  wait "$1"
  st=$?
}

# term_task PID: SIGTERM to the task that timeout PID runs, not to timeout (which would then
# SIGKILL it 5 s later, cutting short a clean stop on a loaded machine).
term_task() {
  local child
  child=$(pgrep -P "$1")
  kill -TERM "${child:-$1}"
}

# peak_rss_kb PID: follows PID (timeout(1), whose child is the task) until it exits and prints
# the task's peak resident memory in kB.
peak_rss_kb() {
  local peak=0 kb c
  while kill -0 "$1" 2>/dev/null; do
    for c in $(pgrep -P "$1" 2>/dev/null); do
      kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$c/status" 2>/dev/null || echo 0)
      [ -n "$kb" ] && [ "$kb" -gt "$peak" ] && peak=$kb
    done
    sleep 0.02
  done
  echo "$peak"
}
