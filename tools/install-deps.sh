#!/usr/bin/env bash
# Installs troupe's build dependencies from Debian's packages. Idempotent: quiet and fast when
# everything is already there. Usage: tools/install-deps.sh [--bench] [--fuzz]  (--bench adds Gloo, a
# peer that bench/ compares against; OpenMPI, the other peer, is always installed: the tests use
# mpirun. --fuzz adds clang and its libFuzzer/sanitizer runtimes, for bench/fuzz.sh).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  libcaf-dev capnproto libcapnp-dev
  libboost-dev libboost-program-options-dev
  doctest-dev libeigen3-dev libbenchmark-dev nlohmann-json3-dev
  openmpi-bin libopenmpi-dev  # the tests start workers with mpirun (MpiClusterResolver)
)
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(libgloo-dev) ;;
    --fuzz) packages+=(clang libclang-rt-dev) ;;  # libclang-rt-dev: Debian's default clang's runtimes
    *) echo "install-deps.sh: unknown option $arg (expected --bench or --fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "troupe: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
