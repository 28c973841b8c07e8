#!/usr/bin/env bash
# The checkpoint parser fuzzers, built with clang++ (libFuzzer,
# AddressSanitizer, UndefinedBehaviorSanitizer) and run for a bounded time on
# a copy of their seed corpus. Two steps, so that no timed test compiles:
#
#   tests/fuzz/run_fuzzers.sh build BUILD_DIR   compiles and links the targets (a build target of
#                                               meson, run by ninja); without clang++, its libFuzzer
#                                               runtime or libomp it records why in BUILD_DIR/skipped
#                                               and succeeds (tools/setup.sh installs them)
#   tests/fuzz/run_fuzzers.sh run BUILD_DIR     runs each built target FUZZ_SECONDS (default 20) on a
#                                               copy of its seeds (the meson test); exits 77, meson's
#                                               "skipped", with the recorded reason when none was built
#
# `run` exits non-zero when a fuzzer finds an input that crashes, hits UB,
# leaks, allocates absurdly, hangs or throws anything but tessera::Error, and
# prints where that input was saved.
# Reproduce a saved input:  BUILD_DIR/fuzz_<target> BUILD_DIR/artifacts/<target>/crash-...
set -euo pipefail

if [ $# -ne 2 ] || { [ "$1" != build ] && [ "$1" != run ]; }; then
  echo "usage: $0 build|run BUILD_DIR" >&2
  exit 2
fi
mode=$1
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
fuzz_dir="$root/tests/fuzz"
mkdir -p "$1"
build=$(cd "$1" && pwd)
seconds=${FUZZ_SECONDS:-20}

targets=(metadata safetensors_header)
declare -A max_len=([metadata]=4096 [safetensors_header]=2048)

run_targets() {
  if [ -f "$build/skipped" ]; then
    cat "$build/skipped"
    exit 77
  fi
  local status=0 target
  for target in "${targets[@]}"; do run_target "$target" || status=1; done
  exit $status
}

run_target() {  # target
  local target=$1 binary="$build/fuzz_$1"
  if [ ! -x "$binary" ]; then
    echo "fuzz: $binary was not built (ninja builds it: run_fuzzers.sh build)"
    return 1
  fi
  # libFuzzer adds the inputs that reach new code to the first corpus folder:
  # a working copy, so the seeds in the repository never change.
  local corpus="$build/corpus/$target" artifacts="$build/artifacts/$target" log="$build/fuzz_$target.log"
  mkdir -p "$corpus" "$artifacts"
  cp "$fuzz_dir/corpus/$target"/* "$corpus/"
  echo "fuzz: $target for ${seconds} s (corpus $corpus, log $log)"
  # ASan reports absurd allocations as errors; -malloc_limit_mb makes any single
  # allocation over 256 MiB a crash (no valid input under max_len needs one).
  local rc
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$binary" -max_total_time="$seconds" -max_len="${max_len[$target]}" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=256 -dict="$fuzz_dir/$target.dict" -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  # "#123456 DONE cov: 812 ft: 2304 corp: 301/40Kb lim: 4096 exec/s: 6172 rss: 98Mb"
  local summary execs saved input
  summary=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | tr -s '[:space:]' ' ' || true)
  execs=$(grep -E '^stat::number_of_executed_units:' "$log" | awk '{print $2}' || true)
  if [ $rc -eq 0 ]; then
    echo "fuzz: $target passed: ${execs:-?} inputs in ${seconds} s; ${summary:-no summary}"
    return 0
  fi
  echo "fuzz: $target FAILED (exit $rc); the end of $log:"
  tail -n 60 "$log"
  saved=$(grep -oE 'Test unit written to [^ ]+' "$log" | sed 's/Test unit written to //' | sort -u || true)
  if [ -n "$saved" ]; then
    for input in $saved; do
      echo "fuzz: the failing input was saved at: $input"
      echo "fuzz: reproduce with: $binary $input"
    done
  else
    echo "fuzz: no input was saved; see $log"
  fi
  return 1
}

[ "$mode" = run ] && run_targets

# ---- build -------------------------------------------------------------------------------------
rm -f "$build/skipped"
skip() {  # reason...: recorded for `run`, which reports it as meson's "skipped"
  echo "fuzz: skipped: $*" | tee "$build/skipped"
  exit 0
}
cxx=${FUZZ_CXX:-clang++}
command -v "$cxx" >/dev/null || skip "$cxx is not installed (tools/setup.sh installs the Debian package clang)"

# Dependencies found the way meson.build finds them (pkg-config): fmt, nlohmann_json,
# eigen3 (the CPU kernels that tensor/ops pulls in); OpenMP through clang's libomp.
read -r -a dep_cflags <<<"$(pkg-config --cflags fmt nlohmann_json eigen3)"
read -r -a dep_libs <<<"$(pkg-config --libs fmt)"
# The header meson writes at build time (tensor/meson.build): the raw ops
# with a same-named differentiable twin, which raw_op_guard.cpp includes.
generated="$build/generated"
twins="$generated/tensor/raw_op_twins.h"
if [ ! -f "$twins" ] || [ "$root/tensor/raw_op_twins.py" -nt "$twins" ] || [ "$root/tensor/ops.h" -nt "$twins" ] ||
  [ "$root/autograd/functions.h" -nt "$twins" ]; then
  mkdir -p "$generated/tensor"
  python3 "$root/tensor/raw_op_twins.py" "$root/tensor/ops.h" "$root/autograd/functions.h" "$twins"
fi
common_flags=(-std=c++20 -g -fno-omit-frame-pointer -fopenmp -Wno-unknown-warning-option -I"$root" -I"$generated"
  "${dep_cflags[@]}")
# UB must abort so that libFuzzer saves the input, not print and go on.
fuzz_flags=(-O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all)
link_sanitizers=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
# Code the fuzzers link but never run builds plain and fast: instrumenting it
# would add no coverage and no checks, and would triple the build time.
link_only_flags=(-O0)

probe="$build/probe"
mkdir -p "$probe"
cat >"$probe/probe.cpp" <<'PROBE'
#include <omp.h>
extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return omp_get_max_threads() < 0; }
PROBE
if ! "$cxx" "${link_sanitizers[@]}" -fopenmp "$probe/probe.cpp" -o "$probe/probe" 2>"$probe/probe.log"; then
  skip "$cxx cannot build a libFuzzer target with ASan, UBSan and OpenMP (tools/setup.sh installs the Debian" \
    "packages libclang-rt-dev and libomp-dev): $(head -c 2000 "$probe/probe.log")"
fi

# The parsers and the code they run (dtype names and sizes), instrumented.
fuzzed_sources=(
  checkpoint/metadata.cpp checkpoint/sealed_json.cpp checkpoint/checksum.cpp checkpoint/safetensors.cpp
  checkpoint/file_io.cpp tensor/dtype.cpp tensor/tensor.cpp
)
# What they link against without running it: safetensors.cpp's writer and
# reader need tensor/ops, whose kernel table needs every CPU kernel (found with
# `ld --trace` against libtessera.a; a missing file shows as an undefined
# reference at the link below).
link_only_sources=(
  tensor/device.cpp tensor/device_runtime.cpp tensor/kernels.cpp tensor/no_cuda_runtime.cpp tensor/parallel.cpp
  tensor/philox.cpp tensor/raw_op_guard.cpp tensor/storage.cpp
  tensor/ops/copy.cpp tensor/ops/creation.cpp tensor/ops/views.cpp
  tensor/cpu/allocator.cpp tensor/cpu/attention.cpp tensor/cpu/elementwise.cpp tensor/cpu/gemm.cpp tensor/cpu/indexing.cpp
  tensor/cpu/kernel_table.cpp tensor/cpu/matmul.cpp tensor/cpu/normalization.cpp tensor/cpu/optimizer.cpp
  tensor/cpu/quantization.cpp tensor/cpu/reduction.cpp
)
target_sources=()
for target in "${targets[@]}"; do target_sources+=("tests/fuzz/fuzz_$target.cpp"); done

# Objects are rebuilt when their source, a header they include (clang's
# depfiles list them) or the flags changed.
objects_dir="$build/objects"
mkdir -p "$objects_dir"
signature="$cxx ${common_flags[*]} / ${fuzz_flags[*]} / ${link_only_flags[*]}"
if [ "$(cat "$objects_dir/flags" 2>/dev/null)" != "$signature" ]; then
  rm -f "$objects_dir"/*.o
  echo "$signature" >"$objects_dir/flags"
fi
needs_build() {  # object: missing, or older than its source or a header it includes
  local depfile=${1%.o}.d dependency
  [ -f "$1" ] && [ -f "$depfile" ] || return 0
  for dependency in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$depfile"); do
    [ "$dependency" -nt "$1" ] && return 0
  done
  return 1
}
object_for() {  # source -> object: tests/fuzz/fuzz_x.cpp -> fuzz_x.o, tensor/ops/copy.cpp -> tensor_ops_copy.o
  local name=${1%.cpp}
  [[ $1 == tests/fuzz/* ]] && name=$(basename "$name")
  echo "$objects_dir/${name//\//_}.o"
}
compile() {  # source flags...
  local source=$1 object
  object=$(object_for "$source")
  shift
  "$cxx" "${common_flags[@]}" "$@" -MMD -MF "${object%.o}.d" -c "$root/$source" -o "$object" ||
    { rm -f "$object"; touch "$objects_dir/failed"; }
}
objects=()
for source in "${fuzzed_sources[@]}" "${link_only_sources[@]}"; do objects+=("$(object_for "$source")"); done
jobs=$(nproc 2>/dev/null || echo 2)
rm -f "$objects_dir/failed"
compiled=0
for source in "${fuzzed_sources[@]}" "${target_sources[@]}" "${link_only_sources[@]}"; do
  needs_build "$(object_for "$source")" || continue
  [ $compiled -gt 0 ] || echo "fuzz: compiling with $cxx into $objects_dir"
  compiled=$((compiled + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  if [[ " ${link_only_sources[*]} " == *" $source "* ]]; then
    compile "$source" "${link_only_flags[@]}" &
  else
    compile "$source" "${fuzz_flags[@]}" &
  fi
done
wait
if [ -f "$objects_dir/failed" ]; then
  echo "fuzz: compilation failed"
  exit 1
fi

for target in "${targets[@]}"; do
  binary="$build/fuzz_$target"
  newest=$(ls -t "$(object_for "tests/fuzz/fuzz_$target.cpp")" "${objects[@]}" | head -n 1)
  [ -x "$binary" ] && [ "$binary" -nt "$newest" ] && continue
  "$cxx" "${link_sanitizers[@]}" -fopenmp "$(object_for "tests/fuzz/fuzz_$target.cpp")" "${objects[@]}" \
    "${dep_libs[@]}" -pthread -o "$binary"
done
