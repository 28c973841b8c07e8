#!/usr/bin/env bash
# Downloads (never installs) the Debian packages that the nvidia build needs
# and a GPU machine may lack, into .gpu-bundle/ (git-ignored), so that a
# machine with no package registry can build tessera: tools/gpu_check.sh
# unpacks them into a private prefix there. Without MPI (one GPU, one rank);
# meson and ninja are in the bundle in case the machine has none of its own.
# The CUDA toolkit itself is not Debian's: the GPU machine brings it.
#
#   bash tools/gpu_bundle.sh [DIR]        # DIR defaults to .gpu-bundle
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=${1:-.gpu-bundle}
packages=(
  libeigen3-dev doctest-dev                   # headers: CPU kernels, tests
  libfmt-dev libfmt9                          # formatting (a shared library)
  libcli11-dev nlohmann-json3-dev             # flags, JSON
  pkgconf pkgconf-bin libpkgconf3             # meson finds the above through pkg-config
  meson ninja-build                           # the build, if the machine has none
)
max_bytes=$((60 * 1024 * 1024))

rm -rf "$bundle"
mkdir -p "$bundle"
# apt-get download writes into the current folder; as root it warns that the
# sandbox user cannot write there, which is harmless.
(cd "$bundle" && apt-get download "${packages[@]}" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' || true)
for package in "${packages[@]}"; do
  ls "$bundle/${package}"_*.deb >/dev/null 2>&1 || { echo "gpu_bundle: $package was not downloaded" >&2; exit 1; }
done
bytes=$(du -sb "$bundle" | cut -f1)
if [ "$bytes" -gt "$max_bytes" ]; then
  echo "gpu_bundle: $bundle holds $bytes bytes, over the $max_bytes the GPU machine's transfer allows" >&2
  exit 1
fi
# The packages' versions, for the check's report.
(cd "$bundle" && ls -1 ./*.deb | sed 's|^\./||') >"$bundle/MANIFEST"
echo "gpu_bundle: ${#packages[@]} packages, $((bytes / 1024)) KiB in $bundle"
