#!/usr/bin/env bash
# Packs the GPU test programs (BUILD_DIR/tests/troupe_gpu_*), the NCCL all-reduce benchmark
# (BUILD_DIR/bench/allreduce_nccl_bench) and the training comparison (BUILD_DIR/examples/
# mlp_classifier with bench/gpu_training_bench.sh and its PyTorch twin bench/torch_mlp.py) into a
# folder that runs on a GPU machine without troupe's build dependencies (CAF, Cap'n Proto, Boost,
# Google Benchmark):
#
#   OUTDIR/bin/         the programs, stripped
#   OUTDIR/bench/       gpu_training_bench.sh and torch_mlp.py; host_scaling.sh (the ring and fit
#                       on the host's cores beside PyTorch: OUTDIR/bench/host_scaling.sh OUTDIR/bin OUT)
#                       with torch_gloo_allreduce.py, for which tcp_allreduce_bench is packed too;
#                       ring_sweep.sh (the ring's segment size, send-ahead and spin at 4-8 ranks:
#                       OUTDIR/bench/ring_sweep.sh OUTDIR/bin OUT);
#                       tag_cost_host.sh with tag_cost.sh (the frame tags' cost: OUTDIR/bench/
#                       tag_cost_host.sh OUTDIR/bin [OTHER_PACK/bin] OUT), for which frame_tag_bench
#                       and bulk_tag_bench (the ps data connections' tags, in line and beside) are
#                       packed too
#   OUTDIR/lib/         every shared library they load that is not part of the base system
#                       (libtroupe, libcaf_*, libcapnp, libkj, libboost_*, libbenchmark, ...), stripped
#   OUTDIR/gpu_run.sh   runs the tests and the benchmark there (bench/gpu_run.sh)
#
#   tools/pack-gpu.sh OUTDIR [BUILD_DIR]      (BUILD_DIR: $TROUPE_BUILD_DIR, else build/)
#
# Left out on purpose, the GPU machine provides them: the C and C++ runtimes (libc, libm,
# libstdc++, libgcc_s, the dynamic loader and the rest of glibc), libz, the CUDA driver
# (libcuda, libnvidia-*), NCCL (libnccl.so.2) and cuBLASLt (libcublasLt.so.13, loaded when the
# first GPU product runs; gpu_run.sh finds NCCL and cuBLAS in PyTorch's nvidia-* packages there).
# The CUDA runtime is linked statically.
# Builds nothing: build the targets first (cmake --build BUILD_DIR --target allreduce_nccl_bench
# troupe_gpu_tests troupe_gpu_kernel_tests troupe_gpu_strategy_tests mlp_classifier).
set -euo pipefail

usage() { echo "usage: tools/pack-gpu.sh OUTDIR [BUILD_DIR]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
[[ $1 != -h && $1 != --help ]] || usage

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$1
build=${2:-${TROUPE_BUILD_DIR:-$root/build}}
[[ -d $build ]] || { echo "pack-gpu.sh: build folder $build not found" >&2; exit 1; }
command -v ldd >/dev/null || { echo "pack-gpu.sh: ldd not found" >&2; exit 1; }

programs=()
for f in "$build"/tests/troupe_gpu_* "$build"/bench/allreduce_nccl_bench "$build"/examples/mlp_classifier \
         "$build"/bench/tcp_allreduce_bench "$build"/bench/frame_tag_bench "$build"/bench/bulk_tag_bench; do
  [[ -f $f && -x $f ]] && programs+=("$f")
done
if [[ ${#programs[@]} -eq 0 ]]; then
  echo "pack-gpu.sh: no GPU programs in $build (tests/troupe_gpu_*, bench/allreduce_nccl_bench);" \
       "is CUDA found (TROUPE_HAVE_CUDA) and are they built?" >&2
  exit 1
fi
[[ -x $build/bench/allreduce_nccl_bench ]] ||
  echo "pack-gpu.sh: note: $build/bench/allreduce_nccl_bench is not built; packing the tests only" >&2

# Libraries the base system (or the GPU driver and NCCL) provides: never packed.
is_system_lib() {
  case $1 in
    linux-vdso.so* | linux-gate.so* | ld-linux*.so* | ld64.so*) return 0 ;;
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libutil.so* | libresolv.so*) return 0 ;;
    libstdc++.so* | libgcc_s.so* | libz.so*) return 0 ;;
    libcuda.so* | libnvidia-*.so* | libnccl.so* | libcublas*.so* | libcudnn*.so*) return 0 ;;
  esac
  return 1
}

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"

strip_copy() {  # strip_copy FILE: strips a packed copy, leaving it as is where strip cannot
  if command -v strip >/dev/null; then
    strip --strip-unneeded "$1" 2>/dev/null || echo "pack-gpu.sh: note: could not strip $1" >&2
  fi
}

declare -A packed=()
missing=()
for prog in "${programs[@]}"; do
  cp -L "$prog" "$out/bin/"
  chmod u+w "$out/bin/$(basename "$prog")"
  strip_copy "$out/bin/$(basename "$prog")"
  # ldd lists the whole closure (the libraries' own dependencies too): "name => path (addr)".
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    is_system_lib "$name" && continue
    if [[ $path == "not" ]]; then
      missing+=("$name (needed by $(basename "$prog"))")
      continue
    fi
    [[ -n ${packed[$name]:-} ]] && continue
    cp -L "$path" "$out/lib/$name"
    chmod u+w "$out/lib/$name"
    strip_copy "$out/lib/$name"
    packed[$name]=$path
  done < <(ldd "$prog")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  printf 'pack-gpu.sh: ldd cannot resolve: %s\n' "${missing[@]}" >&2
  exit 1
fi

cp "$root/bench/gpu_run.sh" "$out/gpu_run.sh"
chmod +x "$out/gpu_run.sh"
mkdir -p "$out/bench"
cp "$root/bench/gpu_training_bench.sh" "$root/bench/torch_mlp.py" "$root/bench/host_scaling.sh" \
   "$root/bench/torch_gloo_allreduce.py" "$root/bench/tag_cost.sh" "$root/bench/tag_cost_host.sh" \
   "$root/bench/ring_sweep.sh" "$out/bench/"
chmod +x "$out/bench/gpu_training_bench.sh" "$out/bench/host_scaling.sh" "$out/bench/tag_cost.sh" \
  "$out/bench/tag_cost_host.sh"
{
  echo "troupe GPU pack"
  echo "source: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built on: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") ($(uname -m))"
  echo "build folder: $(cd "$build" && pwd)"
  echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "needs on the GPU machine: the NVIDIA driver (libcuda.so.1), NCCL (libnccl.so.2), cuBLASLt (libcublasLt.so.13), glibc and libstdc++"
  echo "compares with: PyTorch with CUDA (python3), when the machine has it"
} >"$out/PACK-INFO.txt"

echo "pack-gpu.sh: $out: ${#programs[@]} programs, ${#packed[@]} libraries, $(du -sh "$out" | cut -f1)"
for prog in "${programs[@]}"; do echo "  bin/$(basename "$prog")"; done
for name in $(printf '%s\n' "${!packed[@]}" | sort); do echo "  lib/$name"; done
echo "run it on the GPU machine: $out/gpu_run.sh [$out] [RESULTS_DIR]"
