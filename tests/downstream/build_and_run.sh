#!/usr/bin/env bash
# The downstream check: `meson install` this build into a temporary root,
# then, against that tree alone: build examples/mlp/train_mlp.cpp with
# pkg-config (as docs/install.md tells a user to), and build it again with a
# model author's program (model_author.cpp) as a CMake project through
# find_package(tessera); run all three. The tree must hold the public
# headers and no plumbing. Exits non-zero, naming the step, when any step fails.
#   build_and_run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source_dir=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

meson install -C "$build" --no-rebuild --quiet --destdir "$root" >/dev/null ||
  { echo "downstream: meson install failed"; exit 1; }
pc=$(find "$root" -name tessera.pc | head -1)
[ -n "$pc" ] || { echo "downstream: meson install wrote no tessera.pc"; exit 1; }

# The headers: exactly tools/install_headers.py's public list, and none of the plumbing.
include_root=$(find "$root" -type d -path '*/include/tessera' | head -1)
installed=$(cd "$include_root" && find . -name '*.h' | sed 's|^\./||' | sort)
expected=$(python3 "$source_dir/tools/install_headers.py" --list "$source_dir")
[ "$installed" = "$expected" ] || { echo "downstream: installed headers differ from the public list:";
  diff <(echo "$expected") <(echo "$installed"); exit 1; }
for plumbing in dist/launch/tcp_socket.h dist/launch/store_protocol.h dist/launch/lifeline.h \
  dist/backends/mpi_backend.h fsdp/param_group.h tensor/kernels.h; do
  [ ! -e "$include_root/$plumbing" ] || { echo "downstream: plumbing installed: $plumbing"; exit 1; }
done
echo "downstream: $(wc -l <<<"$installed") public headers installed, no plumbing"

# pkg-config. The .pc names the configured prefix; the sysroot puts its paths under the temporary root.
export PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$root
flags=$(pkg-config --cflags --libs tessera) || { echo "downstream: pkg-config --cflags --libs tessera failed"; exit 1; }
echo "downstream: c++ -std=c++20 train_mlp.cpp $flags"
"${CXX:-c++}" -std=c++20 -O1 "$source_dir/examples/mlp/train_mlp.cpp" $flags -o "$root/train_mlp" ||
  { echo "downstream: the build against the installed tree failed"; exit 1; }
libdir=$(pkg-config --variable=libdir tessera)
[ -d "$libdir" ] || libdir=$root$libdir  # pkgconf applies the sysroot to variables; pkg-config does not
LD_LIBRARY_PATH="$libdir" "$root/train_mlp"

# CMake: the package's own paths are relative to where it lies, so the temporary root needs no sysroot.
package=$(dirname "$(find "$root" -name tesseraConfig.cmake | head -1)")
[ -n "$package" ] && [ "$package" != . ] || { echo "downstream: meson install wrote no tesseraConfig.cmake"; exit 1; }
echo "downstream: cmake -Dtessera_DIR=$package"
cmake -S "$here" -B "$root/cmake-build" -Dtessera_DIR="$package" -DTESSERA_SOURCE_DIR="$source_dir" \
  -DCMAKE_CXX_FLAGS=-O1 >/dev/null ||
  { echo "downstream: cmake could not configure against the installed package"; exit 1; }
cmake --build "$root/cmake-build" -j 2 >/dev/null || { echo "downstream: the CMake build failed"; exit 1; }
# No LD_LIBRARY_PATH: CMake gives the programs the imported library's directory as their run path.
"$root/cmake-build/train_mlp" 3
"$root/cmake-build/model_author" "$root/checkpoint"
