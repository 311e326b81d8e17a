# Sourced by the multi-worker check scripts: a scratch folder, the launcher started in the
# background and waited for (bounded), and the fields of the workers' result lines.
# Before sourcing, a script may set `label` (its mode, shown by fail). After sourcing: $dir is the
# scratch folder, removed on exit with every background process registered by track.

dir="$(mktemp -d)"
tracked=()
# track PID: a background process killed (SIGKILL) on exit unless untracked first.
track() { tracked+=("$1"); }
untrack() {
  local keep=() p
  for p in "${tracked[@]}"; do [ "$p" != "$1" ] && keep+=("$p"); done
  tracked=("${keep[@]}")
}
cleanup() {
  local p
  for p in "${tracked[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT

# fail MESSAGE: prints it with every output file of the run, and exits 1.
fail() {
  echo "FAILED${label:+ ($label)}: $*"
  local f
  for f in "$dir"/*.out; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$f")"
    cat "$f"
  done
  exit 1
}

# field RANK KEY [FILE [KINDS]]: the value of KEY= on RANK's line of a kind in KINDS (an extended
# regular expression; default "result") in FILE (default $dir/run.out).
field() {
  grep -E "^\[rank $1\] (${4:-result}):" "${3:-$dir/run.out}" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# pids_of RANK WORKERS [INDEX]: the pid on each of RANK's "worker INDEX of WORKERS workers (pid P)"
# lines in $dir/run.out, one a line. INDEX (a basic regular expression) is RANK unless given.
pids_of() {
  sed -n "s/^\[rank $1\] worker ${3:-$1} of $2 workers (pid \([0-9]*\)).*/\1/p" "$dir/run.out"
}

# task I: the TF_CONFIG task name of worker I.
task() { echo "/job:worker/replica:0/task:$1"; }

# wait_for SECONDS COMMAND...: runs COMMAND every 50 ms until it succeeds or SECONDS pass; its
# last status.
wait_for() {
  local seconds="$1" i
  shift
  for ((i = 0; i < seconds * 20; ++i)); do
    "$@" && return 0
    sleep 0.05
  done
  "$@"
}

# start_launcher FILE COMMAND...: runs COMMAND (the launcher) in the background, its output into
# FILE; $launcher_pid is its pid, tracked.
start_launcher() {
  local out="$1"
  shift
  "$@" > "$out" 2>&1 &
  launcher_pid=$!
  track "$launcher_pid"
}

# A port the launcher picked free may be taken by another process before its task binds it: the
# task exits 98 (it cannot listen) and the launcher starts every task again on fresh ports, up to 3
# times. The launcher ends with status 98 when a port stayed taken (always so with --port-base):
# start_cluster and run_launcher start it again then, up to 3 times in all.

# taken_again ATTEMPT FILE: after a launcher that ended with 98, says that a port was taken (the
# first "cannot listen" of FILE); fails after the third attempt.
taken_again() {
  echo "a port was taken (attempt $1): $(grep -h -m 1 'cannot listen' "$2")"
  [ "$1" = 3 ] && fail "no free ports after 3 tries"
}

# start_cluster FILE READY COMMAND...: start_launcher FILE COMMAND..., then waits up to
# ${form_s:-30} s for READY (a command: every rank formed the cluster, or what the caller waits
# for first), failing when it never holds, or when the launcher ends first for another reason than
# a port that stayed taken (status 98: started again).
start_cluster() {
  local out="$1" ready="$2" attempt
  shift 2
  for attempt in 1 2 3; do
    start_launcher "$out" "$@"
    ready_or_ended() { "$ready" || ! kill -0 "$launcher_pid" 2>/dev/null; }
    wait_for "${form_s:-30}" ready_or_ended || fail "the cluster did not form within ${form_s:-30} s ($ready never held)"
    "$ready" && return 0
    wait_launcher 5 " after it ended"
    [ "$rc" = 98 ] || fail "the launcher exited $rc before $ready held"
    taken_again "$attempt" "$out"
  done
}

# run_launcher FILE COMMAND...: runs COMMAND (the launcher) to its end, its output into FILE, and
# sets $rc to its status; again, up to 3 times in all, while it ends with 98 (a port stayed taken).
run_launcher() {
  local out="$1" attempt
  shift
  for attempt in 1 2 3; do
    "$@" > "$out" 2>&1
    rc=$?
    [ "$rc" = 98 ] || return 0
    taken_again "$attempt" "$out"
  done
}

# wait_launcher SECONDS WHAT: waits for $launcher_pid to exit, failing ("the launcher did not
# finish within SECONDS s WHAT") when it still runs then; $rc is its status.
wait_launcher() {
  local seconds="$1" what="$2"
  gone() { ! kill -0 "$launcher_pid" 2>/dev/null; }
  wait_for "$seconds" gone || fail "the launcher did not finish within $seconds s$what"
  wait "$launcher_pid"
  rc=$?
  untrack "$launcher_pid"
  launcher_pid=""
}

# same_weights RANK...: fails unless every RANK printed a weights_digest, all equal; $d0 is it.
same_weights() {
  d0=$(field "$1" weights_digest)
  local r
  for r in "$@"; do
    [ -n "$d0" ] && [ "$(field "$r" weights_digest)" = "$d0" ] ||
      fail "rank $r ended with weights '$(field "$r" weights_digest)', rank $1 with '$d0'"
  done
}

# check_below_min LOST: the run ($rc) failed with ranks 0 and 1 left below min_workers (3) after
# the loss of task LOST. Every survivor finds it; the first to exit makes the launcher stop the
# other, which may not have printed its line yet (seen under load): at least one names the
# fallback and the lost task, and none prints a result. $named counts those that named it.
check_below_min() {
  [ "$rc" != 0 ] || fail "the run exited 0 with fewer workers than min_workers"
  named=0
  local r
  for r in 0 1; do
    grep -q "^\[rank $r\] .*elastic membership falls back to the restart path: 2 worker(s) would be left, fewer than min_workers (3); lost: $(task "$1") " \
      "$dir/run.out" && named=$((named + 1))
  done
  [ "$named" -ge 1 ] || fail "no survivor names the fallback below min_workers"
  grep -q "^\[rank [01]\] result:" "$dir/run.out" && fail "a rank printed a result below min_workers"
}

# signal_rank RANK PID SIGNAL: sends SIGNAL to RANK's process PID, failing when it already ended.
signal_rank() {
  kill -0 "$2" 2>/dev/null || fail "rank $1 ended before it could be signalled"
  kill -"$3" "$2"
}
