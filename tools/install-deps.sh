#!/usr/bin/env bash
# Installs troupe's build dependencies from Debian's packages. Idempotent: quiet and fast when
# everything is already there. Usage: tools/install-deps.sh [--bench]  (--bench adds Gloo, a peer
# that bench/ compares against; OpenMPI, the other peer, is always installed: the tests use mpirun).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  libcaf-dev capnproto libcapnp-dev
  libboost-dev libcli11-dev
  doctest-dev libeigen3-dev libbenchmark-dev nlohmann-json3-dev
  openmpi-bin libopenmpi-dev  # the tests start workers with mpirun (MpiClusterResolver)
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(libgloo-dev)
fi

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
