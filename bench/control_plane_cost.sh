#!/usr/bin/env bash
# What the control plane's mutual TLS costs, against plain BASP (no token), on loopback:
#   start-up: wall time from starting 3 mw_worker processes (mode join) to the last one's exit,
#             median of RUNS;
#   heartbeat: CPU time (user + system) of the chief and of a worker over IDLE_MS of watching
#             with a heartbeat every BEAT_MS, per heartbeat interval, median of RUNS.
# Usage: bench/control_plane_cost.sh build/tests/multiworker/mw_worker [RUNS] [IDLE_MS] [BEAT_MS]
set -u
worker="$1"; runs="${2:-7}"; idle_ms="${3:-5000}"; beat_ms="${4:-50}"
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT

ports() {
  python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# one_cluster MODE TOKEN: runs 3 workers; prints "wall_ms chief_cpu_ms worker_cpu_ms".
one_cluster() {
  local mode="$1" token="$2" list="" pids=()
  read -r -a p <<< "$(ports)"
  for i in 0 1 2; do list+="${list:+, }\"127.0.0.1:${p[$i]}\""; done
  local start; start=$(date +%s%N)
  for i in 0 1 2; do
    env TROUPE_CLUSTER_TOKEN="$token" TROUPE_HEARTBEAT_MS="$beat_ms" MW_IDLE_MS="$idle_ms" \
      TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      /usr/bin/time -f "%U %S" -o "$dir/cpu$i" timeout 60 "$worker" "$mode" > "$dir/out$i" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "a worker failed: $(cat "$dir"/out*)" >&2; exit 1; }; done
  local end; end=$(date +%s%N)
  awk -v w=$(( (end - start) / 1000000 )) 'FNR==1 {cpu[FILENAME]=($1+$2)*1000} END {
    printf "%d %.0f %.0f\n", w, cpu[ARGV[1]], cpu[ARGV[2]] }' "$dir/cpu0" "$dir/cpu1"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for label in plain tls; do
  token=""; [ "$label" = tls ] && token="bench-token-$$"
  : > "$dir/join_$label"; : > "$dir/idle_$label"
  for _ in $(seq 1 "$runs"); do one_cluster join "$token" >> "$dir/join_$label"; done
  for _ in $(seq 1 "$runs"); do one_cluster idle "$token" >> "$dir/idle_$label"; done
  beats=$(( idle_ms / beat_ms ))
  echo "$label: start-up (3 workers, process start to exit) $(cut -d' ' -f1 "$dir/join_$label" | median) ms;" \
       "watching ${idle_ms} ms at ${beat_ms} ms: chief $(cut -d' ' -f2 "$dir/idle_$label" | median) ms CPU," \
       "worker $(cut -d' ' -f3 "$dir/idle_$label" | median) ms CPU over $beats intervals"
done
