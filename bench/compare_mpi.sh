#!/usr/bin/env bash
# troupe's shared-memory all-reduce (allreduce_shm_bench: N replica threads of one process,
# MirroredStrategy + ReplicaContext::all_reduce) against OpenMPI's MPI_Allreduce between N
# processes on shared memory (mpi_allreduce under mpirun, default btl: vader/sm), float32 SUM,
# run side by side in one invocation and interleaved: for every round, size and N, one troupe
# run and one mpirun, alternating which goes first. Each run reports the median of REPS
# repetitions; the table shows the median over ROUNDS of those, per size, and the ratio
# OpenMPI / troupe (how many times faster troupe is).
#
#   bench/compare_mpi.sh [BUILD_DIR]          (default: build/ in the repository root)
#
# Environment: ROUNDS (3), REPS (3), NPROCS ("2 4"), SIZES (bytes, default 4 B .. 64 MiB),
# KEEP=1 keeps the raw JSON/text results (their folder is printed).
# Needs OpenMPI (tools/install-deps.sh --bench) and python3. Builds the two programs if needed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
NPROCS=${NPROCS:-"2 4"}
SIZES=${SIZES:-"4 64 1024 4096 16384 65536 262144 1048576 4194304 16777216 67108864"}

command -v mpirun >/dev/null || { echo "compare_mpi.sh: mpirun not found (tools/install-deps.sh --bench)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "compare_mpi.sh: python3 not found" >&2; exit 1; }

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" >/dev/null
fi
cmake --build "$build" -j2 --target allreduce_shm_bench mpi_allreduce >/dev/null
troupe_bin=$build/bench/allreduce_shm_bench
mpi_bin=$build/bench/mpi_allreduce
[[ -x $troupe_bin ]] || { echo "compare_mpi.sh: $troupe_bin was not built" >&2; exit 1; }
[[ -x $mpi_bin ]] || { echo "compare_mpi.sh: $mpi_bin was not built (is MPI found by CMake?)" >&2; exit 1; }

out=$(mktemp -d "${TMPDIR:-/tmp}/troupe_vs_mpi.XXXXXX")
if [[ ${KEEP:-0} != 1 ]]; then trap 'rm -rf "$out"' EXIT; fi

# We run as root in containers; OpenMPI refuses that unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run_troupe() {  # round size n
  "$troupe_bin" --troupe_stream_runs=0 --benchmark_filter="^BM_AllReduce_Shm/$2/$3/" \
    --benchmark_repetitions="$REPS" --benchmark_format=json >"$out/troupe.$1.$2.$3.json" 2>"$out/troupe.$1.$2.$3.err" ||
    { echo "compare_mpi.sh: allreduce_shm_bench failed:" >&2; cat "$out/troupe.$1.$2.$3.err" >&2; exit 1; }
}
run_mpi() {  # round size n
  mpirun --oversubscribe --allow-run-as-root -n "$3" "$mpi_bin" -r "$REPS" "$2" >"$out/mpi.$1.$2.$3.txt" 2>&1 ||
    { echo "compare_mpi.sh: mpirun failed:" >&2; cat "$out/mpi.$1.$2.$3.txt" >&2; exit 1; }
}

echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1)" >&2
for ((round = 0; round < ROUNDS; ++round)); do
  echo "round $((round + 1))/$ROUNDS ..." >&2
  for size in $SIZES; do
    for n in $NPROCS; do
      if ((round % 2 == 0)); then
        run_troupe "$round" "$size" "$n"; run_mpi "$round" "$size" "$n"
      else
        run_mpi "$round" "$size" "$n"; run_troupe "$round" "$size" "$n"
      fi
    done
  done
done

python3 - "$out" "$SIZES" "$NPROCS" <<'EOF'
import glob, json, os, re, statistics, sys

out, sizes, nprocs = sys.argv[1], [int(s) for s in sys.argv[2].split()], [int(n) for n in sys.argv[3].split()]
to_us = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}

def troupe_us(path):
    with open(path) as f:
        data = json.load(f)
    runs = [b for b in data["benchmarks"] if not b.get("error_occurred")]
    med = [b for b in runs if b.get("aggregate_name") == "median"]
    if not med:  # a single repetition reports no aggregates
        med = [b for b in runs if b.get("run_type", "iteration") == "iteration"]
    if not med:
        sys.exit(f"compare_mpi.sh: no result in {path}")
    return med[0]["real_time"] * to_us[med[0]["time_unit"]]

def mpi_us(path):
    with open(path) as f:
        m = re.search(r"median_us=([0-9.]+)", f.read())
    if not m:
        sys.exit(f"compare_mpi.sh: no result in {path}")
    return float(m.group(1))

def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"

def fmt_time(us):
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} us"

misses = []
for n in nprocs:
    print(f"\nn = {n}: float32 SUM all-reduce, time per op (median over rounds); ratio = OpenMPI / troupe")
    print(f"| size | troupe (threads) | OpenMPI shm (processes) | ratio |")
    print(f"|---|---|---|---|")
    for s in sizes:
        t = statistics.median(troupe_us(p) for p in glob.glob(f"{out}/troupe.*.{s}.{n}.json"))
        m = statistics.median(mpi_us(p) for p in glob.glob(f"{out}/mpi.*.{s}.{n}.txt"))
        print(f"| {human(s)} | {fmt_time(t)} | {fmt_time(m)} | {m / t:.2f}x |")
        if n == 4:
            need = 4.0 if s >= 64 * 1024 else 2.0
            if m / t < need:
                misses.append(f"{human(s)} ({m / t:.2f}x < {need:.0f}x)")
    if n == 4:
        print("target (troupe >= 2x faster than OpenMPI with 4 processes, >= 4x from 64 KiB): " +
              ("met at every size" if not misses else "missed at " + ", ".join(misses)))
if os.environ.get("KEEP") == "1":
    print(f"\nraw results: {out}")
EOF
