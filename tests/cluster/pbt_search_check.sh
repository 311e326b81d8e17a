#!/usr/bin/env bash
# The pbt_search sample as real processes on loopback: a chief and 2 workers (TF_CONFIG each), every
# task bounded in time and killed on exit.
#   pbt_search_check.sh SCENARIO PBT_SEARCH
# Scenarios:
#   search         6 trials, 6 generations: every task exits 0, the result line is the chief's last,
#                  the best validation accuracy after the last generation is above the best after
#                  the first (best_final > best_initial), nothing respawned, no worker lost; every
#                  generation's best, as printed, is the best of the trials' epoch_accuracy scalars
#                  in --tensorboard-dir (read by TensorBoard's own reader)
#   worker-killed  worker 1 SIGKILLed mid-search (after generation 2 of 8): its trials, and only
#                  they, are respawned on worker 0 from their last copy (respawned = the trials it
#                  held, workers_lost=1), the search still runs all 8 generations and ends better
#                  than it began; the chief and worker 0 exit 0
set -uo pipefail
scenario="$1"
pbt="$2"
dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $scenario: $*"
  for f in "$dir"/*.log; do echo "--- $(basename "$f")"; tail -n 40 "$f"; done
  exit 1
}
# shellcheck source=../lib/cluster_common.sh
source "$(dirname "$0")/../lib/cluster_common.sh"
pick_ports() {
  read -r p0 p1 p2 <<< "$(free_ports 3)"
  cluster="{\"chief\": [\"127.0.0.1:$p2\"], \"worker\": [\"127.0.0.1:$p0\", \"127.0.0.1:$p1\"]}"
}
pick_ports
# start NAME TYPE INDEX ARGS...: the sample in that role, in the background, under timeout (which
# leads a process group of its own, so the whole task goes on cleanup). A killed worker closes its
# connection, which the chief hears at once; silence counts as lost only after 20 heartbeats
# (10 s), so that a loaded machine loses no worker the test did not kill.
start() {
  local name="$1" type="$2" index="$3"
  shift 3
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}" TROUPE_MISSED_HEARTBEATS=20 \
    timeout -k 5 100 "$pbt" "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
# start_workers ARGS...: both workers, each listening on its port (on fresh ports again when one was
# taken before it bound: start_listening).
worker_args=()
launch_worker() { start "$1" worker "${1#w}" "${worker_args[@]}"; }
worker_listens() { if [[ $1 == w0 ]]; then listens "$pid_w0" "$p0"; else listens "$pid_w1" "$p1"; fi; }
start_workers() {
  worker_args=("$@")
  start_listening worker_listens launch_worker w0 w1
}
wait_for() {  # FILE REGEX SECONDS
  local deadline=$((SECONDS + $3))
  until grep -Eq -- "$2" "$1" 2>/dev/null; do
    [[ $SECONDS -ge $deadline ]] && fail "no line matching '$2' in $(basename "$1") within $3 s"
    sleep 0.05
  done
}
status_of() { wait "$1"; st=$?; }
field() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
# check_result TRIALS GENERATIONS: the chief's last line is the result line; sets $line.
check_result() {
  line=$(tail -n 1 "$dir/chief.log")
  [[ "$line" == "result: trials=$1 generations=$2 "* ]] || fail "the chief's last line is not the result line of $1 trials and $2 generations: $line"
  [[ $(grep -c '^result: ' "$dir/chief.log") == 1 ]] || fail "more than one result line"
  local a0 a
  a0=$(field best_initial); a=$(field best_final)
  awk -v a0="$a0" -v a="$a" 'BEGIN { exit !(a0 > 0.1 && a <= 1 && a > a0) }' ||
    fail "best_final $a is not above best_initial $a0 (or they are not accuracies above chance)"
  [[ $(grep -c '^generation [0-9]*/'"$2"': best ' "$dir/chief.log") == "$2" ]] || fail "not $2 generation lines"
}

args=(--trials 6 --steps 20 --batch 32)
case "$scenario" in
  search)
    start_workers "${args[@]}" --generations 6
    start chief chief 0 "${args[@]}" --generations 6 --tensorboard-dir "$dir/tb"
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief exited $st"
    for w in w0 w1; do status_of "$(eval echo "\$pid_$w")"; [[ $st == 0 ]] || fail "$w exited $st"; done
    check_result 6 6
    [[ "$(field respawned)" == 0 && "$(field workers_lost)" == 0 ]] || fail "respawns or lost workers in a healthy run: $line"
    grep -q '^exploit: trial [0-9] takes trial [0-9]'"'"'s weights, lr ' "$dir/chief.log" || fail "no exploit line"
    python="${TROUPE_TENSORBOARD_VENV:-/opt/troupe-tensorboard}/bin/python"
    "$python" -c "import tensorboard" 2>/dev/null ||
      fail "no tensorboard package in ${TROUPE_TENSORBOARD_VENV:-/opt/troupe-tensorboard}: run tools/install-deps.sh"
    timeout 60 "$python" - "$dir/tb" "$dir/chief.log" <<'EOF' || fail "the TensorBoard scalars disagree with the printed bests"
import glob, re, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
tb, log = sys.argv[1], sys.argv[2]
printed = {int(g): float(a) for g, a in re.findall(r"^generation (\d+)/\d+: best ([0-9.]+)", open(log).read(), re.M)}
best = {}
for t in range(6):
    files = glob.glob("%s/trial_%d/train/events.out.tfevents.*" % (tb, t))
    assert len(files) == 1, "trial %d: event files %s" % (t, files)
    acc = EventAccumulator(files[0], size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("epoch_accuracy", "epoch_loss", "epoch_learning_rate", "epoch_momentum"):
        assert tag in tags, "trial %d has no %s: %s" % (t, tag, tags)
    points = [(e.step, e.value) for e in acc.Scalars("epoch_accuracy")]
    assert [s for s, _ in points] == list(range(1, 7)), "trial %d: accuracy at generations %s" % (t, points)
    for s, v in points:
        best[s] = max(best.get(s, 0.0), v)
for g, a in printed.items():
    assert abs(best[g] - a) < 6e-5, "generation %d: printed best %s, scalars' best %s" % (g, a, best[g])
print("tensorboard: 6 trials x 6 generations, bests %s" % [round(best[g], 4) for g in sorted(best)])
EOF
    echo "$line"
    ;;
  worker-killed)
    # 20 ms per step: a generation takes about a second, so the kill lands mid-search.
    start_workers "${args[@]}" --generations 8 --step-delay-ms 20
    start chief chief 0 "${args[@]}" --generations 8 --step-delay-ms 20
    wait_for "$dir/chief.log" '^generation 2/8: ' 60
    pkill -KILL -P "$pid_w1"  # the worker itself, not the timeout that runs it
    status_of "$pid_chief"; [[ $st == 0 ]] || fail "the chief exited $st after losing worker 1"
    status_of "$pid_w0"; [[ $st == 0 ]] || fail "worker 0 exited $st"
    check_result 6 8
    [[ "$(field workers_lost)" == 1 ]] || fail "workers_lost is not 1: $line"
    # Trials 1, 3 and 5 were placed on worker 1 (round robin): each is respawned on worker 0, once.
    respawns=$(grep -c '^respawned trial [135] on /job:worker/replica:0/task:0 from its last copy (it was on /job:worker/replica:0/task:1)$' "$dir/chief.log")
    [[ "$respawns" == 3 && "$(field respawned)" == 3 ]] || fail "$respawns respawn lines for worker 1's trials, respawned=$(field respawned) (expected 3)"
    [[ $(grep -c '^respawned ' "$dir/chief.log") == 3 ]] || fail "a trial of worker 0 was respawned too"
    echo "$line"
    ;;
  *) fail "no scenario $scenario" ;;
esac
echo PASSED
