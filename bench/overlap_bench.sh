#!/usr/bin/env bash
# The gradient all-reduce hidden behind the backward pass: examples/mlp_classifier (FEATURES ->
# HIDDEN relu -> HIDDEN relu -> CLASSES, plain SGD, global batch BATCH, --cached-batches) with
# 4 CPU replicas in one process and with 2 workers x 2 replicas on loopback, under several
# gradient bucket settings (TROUPE_GRADIENT_BUCKET_BYTES), interleaved round by round so that a
# noisy neighbour hits all of them alike.
#
# Settings (name=bytes): "unbucketed=0" is one all-reduce after the backward pass through the
# ordinary collective; "after-backward=1073741824" is one bucket holding every gradient, started
# when the backward pass ends (the same timing, measured by the bucket clock); the others are
# buckets of that many bytes in reverse layer order, started while earlier layers are still
# differentiated. For the default MLP the gradients in backward order are 40 B, 10 KiB | 1 KiB,
# 256 KiB | 1 KiB, 784 KiB: "per-tensor=1" makes 6 buckets, "256KiB" 4 (any size from 12 KiB to
# 268 KiB gives these), "1MiB" 2 (everything but the first layer's kernel, then that kernel).
#
# Columns, per run the medians over epochs, then the median over rounds and the range:
# - samples/s;
# - all-reduce share: replica 0's time waiting for the gradient all-reduce, over training time
#   (its wait for replicas the OS has not run yet included);
# - exposed share: the part of that wait after every replica of the process had finished its
#   backward pass (started its last bucket), i.e. the all-reduce the backward pass did not hide
#   (measured by the bucketed path only; across workers it also holds the ring's wait for the
#   other worker's replicas);
# - of it, waiting for the other worker: the part of the exposed time in which the ring waited for
#   the other worker to join a bucket's all-reduce (from the start of the ring operation until the
#   first byte of the other worker's share arrived: that worker still differentiating, or its
#   threads not scheduled; Horovod's NEGOTIATE);
# - exposed all-reduce: the exposed share less that wait: the all-reduce itself (the ring's
#   transfers and sums, the local sums, the hand-offs) that backward did not hide.
#
#   bench/overlap_bench.sh [BUILD_DIR]
#   env: ROUNDS=3 EPOCHS=4 BATCH=256 FEATURES=784 HIDDEN=256 CLASSES=10
#        SETTINGS="unbucketed=0 after-backward=1073741824 1MiB=1048576 256KiB=262144 per-tensor=1"
#        LAYOUTS="4x1 2x2"
set -euo pipefail
build_dir=${1:-build}
bin="$build_dir/examples/mlp_classifier"
[[ -x "$bin" ]] || { echo "overlap_bench: $bin not found" >&2; exit 2; }
rounds=${ROUNDS:-3}
epochs=${EPOCHS:-4}
settings=${SETTINGS:-"unbucketed=0 after-backward=1073741824 1MiB=1048576 256KiB=262144 per-tensor=1"}
layouts=${LAYOUTS:-"4x1 2x2"}
common=(--quiet --cached-batches --optimizer sgd --lr 0.05 --batch "${BATCH:-256}" --epochs "$epochs" --samples 16384
        --features "${FEATURES:-784}" --hidden "${HIDDEN:-256}" --classes "${CLASSES:-10}")
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_ports() {
  python3 -c "
import socket
s = [socket.socket() for _ in range($1)]
for x in s: x.bind(('127.0.0.1', 0))
print(' '.join(str(x.getsockname()[1]) for x in s))"
}

# run LAYOUT BYTES: prints the result line of replica 0's process.
run() {
  local layout=$1 bytes=$2
  if [[ "$layout" == 4x1 ]]; then
    TROUPE_GRADIENT_BUCKET_BYTES=$bytes timeout 300 "$bin" --replicas 4 "${common[@]}" 2>/dev/null | grep '^result:'
    return
  fi
  local workers=${layout%%x*} per_worker=${layout#*x} list="" i
  read -r -a ports <<< "$(free_ports "$workers")"
  for ((i = 0; i < workers; ++i)); do list+="${list:+, }\"127.0.0.1:${ports[$i]}\""; done
  pids=()
  for ((i = 0; i < workers; ++i)); do
    TF_CONFIG="{\"cluster\": {\"worker\": [$list]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      TROUPE_DEVICES_PER_WORKER=$per_worker TROUPE_GRADIENT_BUCKET_BYTES=$bytes \
      timeout 300 "$bin" --multi-worker "${common[@]}" > "$tmp/worker$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "overlap_bench: a worker failed:" >&2; cat "$tmp"/worker* >&2; exit 1; }; done
  pids=()
  grep '^result:' "$tmp/worker0"
}

echo "machine: $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')); load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((round = 1; round <= rounds; ++round)); do
  for layout in $layouts; do
    for s in $settings; do
      line=$(run "$layout" "${s#*=}")
      echo "$line" >> "$tmp/$layout-${s%%=*}"
      echo "round $round $layout ${s%%=*}: $line" >&2
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$tmp" "$layouts" "$settings" <<'PY'
import os, statistics, sys
tmp, layouts, settings = sys.argv[1], sys.argv[2].split(), [s.split("=")[0] for s in sys.argv[3].split()]
def fields(path, key):
    out = []
    for line in open(path):
        for part in line.split():
            if part.startswith(key + "="):
                out.append(float(part.split("=", 1)[1]))
    return out
def cell(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"
k = lambda v: f"{v / 1000:.1f} k"
pct = lambda v: f"{100 * v:.0f} %"
print("| layout | buckets | samples/s | all-reduce share | exposed share | of it, waiting for the other worker | exposed all-reduce |")
print("|---|---|---|---|---|---|---|")
for layout in layouts:
    name = "4 replicas, 1 process" if layout == "4x1" else f"{layout.split('x')[0]} workers x {layout.split('x')[1]} replicas, loopback"
    for s in settings:
        path = os.path.join(tmp, f"{layout}-{s}")
        rate, share, exposed = fields(path, "samples_per_s"), fields(path, "allreduce_share"), fields(path, "exposed_share")
        peer = fields(path, "exposed_peer_wait_share")
        own = [e - p for e, p in zip(exposed, peer)]
        if s == "unbucketed":
            cells = ["not measured"] * 3
        else:
            cells = [cell(exposed, pct), cell(peer, pct), cell(own, pct)]
        print(f"| {name} | {s} | {cell(rate, k)} | {cell(share, pct)} | {' | '.join(cells)} |")
PY
