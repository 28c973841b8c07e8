#!/usr/bin/env bash
# Installs what tessera needs to build, test and train from Debian's packages,
# only the packages that are missing (apt-get update runs only then). Idempotent
# and silent when everything is there. Run as root (or with sudo available).
set -euo pipefail

packages=(
  g++ meson ninja-build pkg-config cmake  # toolchain (cmake: the install test builds a CMake project against tessera)
  libeigen3-dev                     # CPU kernels, and the fallback GEMM
  libopenblas-openmp-dev            # CPU GEMM: OpenBLAS on tessera's OpenMP team (tensor/gemm_backend.h)
  doctest-dev                       # tests
  libopenmpi-dev openmpi-bin        # the mpi backend and mpirun for its tests
  iproute2                          # ip: the multi-host test's network namespaces and links
  libfmt-dev libcli11-dev nlohmann-json3-dev  # formatting, flags, JSON-lines logs
  fortunes                          # the GPT example's default text corpus
  clang libclang-rt-dev libomp-dev  # tests/fuzz: clang++, its libFuzzer/sanitizer runtimes, OpenMP for clang
  libboost-context-dev              # the cuda simulator's fibers (tensor/cuda/sim); the CUDA toolkit is not Debian's
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "setup: missing packages (${missing[*]}); run this script as root to install them" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
