#!/usr/bin/env bash
# Installs troupe's build dependencies from Debian's packages. Idempotent: quiet and fast when
# everything is already there. Usage: tools/install-deps.sh [--bench] [--fuzz]  (--bench adds the
# peers that bench/ compares against: Gloo, oneDNN, TensorFlow 2.21 from PyPI for training_bench.sh
# --side-by-side and Ray 2.60 from PyPI for actor_bench.sh, in a virtual environment at $TROUPE_BENCH_VENV, default /opt/troupe-bench, unless
# the python3 on PATH imports tensorflow already; GNU time and perf for the monitor's cost scripts;
# OpenMPI, the other peer, is always installed:
# the tests use mpirun. --fuzz adds clang and its libFuzzer/sanitizer runtimes, for bench/fuzz.sh).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  libcaf-dev capnproto libcapnp-dev
  libboost-dev libcli11-dev libjs-chart.js
  doctest-dev libeigen3-dev libbenchmark-dev nlohmann-json3-dev
  openmpi-bin libopenmpi-dev  # the tests start workers with mpirun (MpiClusterResolver)
  chromium python3-websocket  # the dashboard's test drives headless Chromium over its DevTools protocol
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (format/proto)
  python3-venv  # the tests read those files back with TensorBoard's own reader
)
bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(libgloo-dev libdnnl-dev python3-venv time linux-perf); bench=1 ;;  # time, perf: monitor_*overhead.sh
    --fuzz) packages+=(clang libclang-rt-dev) ;;  # libclang-rt-dev: Debian's default clang's runtimes
    *) echo "install-deps.sh: unknown option $arg (expected --bench or --fuzz)" >&2; exit 2 ;;
  esac
done

# TensorFlow, the peer of training_bench.sh --side-by-side (PyPI's tensorflow-cpu; Debian has none).
install_tensorflow() {
  python3 -c "import tensorflow" 2>/dev/null && return 0
  local venv=${TROUPE_BENCH_VENV:-/opt/troupe-bench}
  "$venv/bin/python" -c "import tensorflow" 2>/dev/null && return 0
  echo "troupe: installing tensorflow-cpu 2.21 into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "tensorflow-cpu==2.21.*"
}

# Ray, the peer of actor_bench.sh (PyPI; Debian has none), in the same virtual environment.
install_ray() {
  local venv=${TROUPE_BENCH_VENV:-/opt/troupe-bench}
  "$venv/bin/python" -c "import ray" 2>/dev/null && return 0
  echo "troupe: installing ray 2.60 into $venv" >&2
  [[ -x "$venv/bin/pip" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q "ray==2.60.*"
}

# TensorBoard (PyPI; Debian has none), whose reader the tests use on troupe's event files, in a
# virtual environment at $TROUPE_TENSORBOARD_VENV, default /opt/troupe-tensorboard.
install_tensorboard() {
  local venv=${TROUPE_TENSORBOARD_VENV:-/opt/troupe-tensorboard}
  "$venv/bin/python" -c "import tensorboard" 2>/dev/null && return 0
  echo "troupe: installing tensorboard into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q tensorboard
}

# scikit-learn's bundled 8x8 handwritten digits (1,797 images; examples/digits_cnn's default data),
# at $TROUPE_DATA_DIR/digits.csv, default /opt/troupe-data: pip downloads the scikit-learn wheel
# alone (--no-deps, about 9 MiB, a few seconds) into a scratch folder, and only
# sklearn/datasets/data/digits.csv.gz is taken out of it and unpacked (265 KB); nothing is installed.
install_digits() {
  local dir=${TROUPE_DATA_DIR:-/opt/troupe-data}
  [[ -s "$dir/digits.csv" ]] && return 0
  local venv=${TROUPE_TENSORBOARD_VENV:-/opt/troupe-tensorboard} scratch
  echo "troupe: fetching scikit-learn's digits into $dir" >&2
  scratch=$(mktemp -d)
  "$venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$scratch" "scikit-learn>=1.0"
  mkdir -p "$dir"
  "$venv/bin/python" - "$scratch" "$dir/digits.csv" <<'PY'
import glob, gzip, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "scikit_learn-*.whl"))[0]
text = gzip.decompress(zipfile.ZipFile(wheel).read("sklearn/datasets/data/digits.csv.gz"))
with open(sys.argv[2] + ".tmp", "wb") as out:
    out.write(text)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
  rm -rf "$scratch"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  install_tensorboard
  install_digits
  if [[ $bench == 1 ]]; then install_tensorflow; install_ray; fi
  exit 0
fi

echo "troupe: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [[ $bench == 1 ]]; then install_tensorflow; install_ray; fi
install_tensorboard
install_digits
