#!/usr/bin/env bash
# The downstream check: `meson install` this build into a temporary root,
# then build examples/mlp/train_mlp.cpp against it with nothing but
# pkg-config (as docs/writing_models.md tells a user to), and run it. Exits non-zero,
# naming the step, when any step fails.
#   build_and_run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source_dir=$2
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

meson install -C "$build" --no-rebuild --quiet --destdir "$root" >/dev/null ||
  { echo "downstream: meson install failed"; exit 1; }
pc=$(find "$root" -name tessera.pc | head -1)
[ -n "$pc" ] || { echo "downstream: meson install wrote no tessera.pc"; exit 1; }
# The .pc names the configured prefix; the sysroot puts its paths under the temporary root.
export PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$root
flags=$(pkg-config --cflags --libs tessera) || { echo "downstream: pkg-config --cflags --libs tessera failed"; exit 1; }
echo "downstream: c++ -std=c++20 train_mlp.cpp $flags"
"${CXX:-c++}" -std=c++20 -O1 "$source_dir/examples/mlp/train_mlp.cpp" $flags -o "$root/train_mlp" ||
  { echo "downstream: the build against the installed tree failed"; exit 1; }
libdir=$(pkg-config --variable=libdir tessera)
[ -d "$libdir" ] || libdir=$root$libdir  # pkgconf applies the sysroot to variables; pkg-config does not
LD_LIBRARY_PATH="$libdir" "$root/train_mlp"
