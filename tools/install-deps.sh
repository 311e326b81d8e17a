#!/usr/bin/env bash
# Installs troupe's build dependencies from Debian's packages. Idempotent: quiet and fast when
# everything is already there. Usage: tools/install-deps.sh [--bench]  (--bench adds the peers
# that bench/ compares against: OpenMPI and Gloo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  libcaf-dev capnproto libcapnp-dev
  libboost-dev libcli11-dev
  doctest-dev libeigen3-dev libbenchmark-dev nlohmann-json3-dev
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(openmpi-bin libopenmpi-dev libgloo-dev)
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
