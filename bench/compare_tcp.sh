#!/usr/bin/env bash
# Cross-process all-reduce on loopback, side by side in one invocation: troupe's TCP ring
# (tcp_allreduce_bench), Gloo's ring (gloo_allreduce), OpenMPI over TCP (mpi_allreduce with
# --mca btl tcp,self), and the exchange floor (tcp_allreduce_bench --floor). Prints, for N = 2
# and 4 processes, each one's median time per operation and the ratio peer / troupe.
# Usage: bench/compare_tcp.sh [BUILD_DIR]     env: NPROCS="2 4" SIZES="4 4096 ..." REPS=3
set -euo pipefail
build="${1:-build}"
nprocs="${NPROCS:-2 4}"
sizes="${SIZES:-4 4096 65536 1048576 16777216 67108864}"
reps="${REPS:-3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p')"
for n in $nprocs; do
  # Alternate the order so that no peer always runs first on a machine that drifts.
  "$build/bench/tcp_allreduce_bench" -n "$n" --reps "$reps" --target-ms 30 $sizes > "$out/troupe$n"
  [ -x "$build/bench/gloo_allreduce" ] && "$build/bench/gloo_allreduce" -n "$n" --reps "$reps" --target-ms 30 $sizes > "$out/gloo$n"
  [ -x "$build/bench/mpi_allreduce" ] && mpirun --oversubscribe -n "$n" --mca btl tcp,self --mca btl_tcp_if_include lo \
    "$build/bench/mpi_allreduce" -r "$reps" -t 30 $sizes > "$out/mpi$n" 2>/dev/null
done
"$build/bench/tcp_allreduce_bench" --floor --reps "$reps" --target-ms 30 $sizes > "$out/floor"
python3 - "$out" "$nprocs" "$sizes" <<'PY'
import re, sys, os
out, nprocs, sizes = sys.argv[1], sys.argv[2].split(), [int(s) for s in sys.argv[3].split()]
def read(name):
    path = os.path.join(out, name)
    res = {}
    if not os.path.exists(path): return res
    for line in open(path):
        m = re.search(r"bytes=(\d+).*median_us=([\d.]+)", line)
        if m: res[int(m.group(1))] = float(m.group(2))
    return res
def fmt(us):
    if us is None: return "-"
    return f"{us/1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"
def ratio(a, b):
    return f"{a/b:.2f}x" if a and b else "-"
floor = read("floor")
for n in nprocs:
    t, g, m = read(f"troupe{n}"), read(f"gloo{n}"), read(f"mpi{n}")
    print(f"\nn = {n}: float32 SUM all-reduce between processes on loopback; ratio = peer / troupe")
    head = "| size | troupe ring | Gloo ring | Gloo/troupe | OpenMPI TCP | MPI/troupe |"
    if n == "2": head += " floor | troupe bandwidth / floor's |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in sizes:
        row = f"| {s} | {fmt(t.get(s))} | {fmt(g.get(s))} | {ratio(g.get(s), t.get(s))} | {fmt(m.get(s))} | {ratio(m.get(s), t.get(s))} |"
        if n == "2": row += f" {fmt(floor.get(s))} | {ratio(floor.get(s), t.get(s))} |"
        print(row)
PY
