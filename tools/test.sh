#!/usr/bin/env bash
# The project's test command: set-up; configure, build and run every meson
# test in build/ (-march=native); then, on a machine with AVX-512, the
# portable variant in build-x86-64-v3/ (AVX2+FMA, what every machine of this
# kind has): the tensor, autograd, nn and fsdp suites again, so that the AVX2
# code paths run there too; then, when nvcc is there, the nvidia
# runtime in build-nvidia/, compiled and resource-checked. Prints alone on the last line
# "N passed, N failed" over both (from the builds' testlog.json) and exits
# non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

native=build
portable=build-x86-64-v3
portable_suites=(tensor autograd nn fsdp)
portable_targets=(tests/tensor/test_tensor tests/autograd/test_autograd tests/nn/test_nn tests/fsdp/test_fsdp)

# Each phase's seconds, printed together before the summary line.
phases=()
phase_done() {  # name start-seconds
  phases+=("$1 $((SECONDS - $2)) s")
  echo "test: $1 took $((SECONDS - $2)) s"
}

summary() {  # passed failed
  [ ${#phases[@]} -eq 0 ] || echo "test: phases: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'), total $SECONDS s"
  echo "$1 passed, $2 failed"
  [ "$2" -eq 0 ]
  exit $?
}

configure() {  # build-dir meson-options...
  local dir=$1
  shift
  if [ -d "$dir/meson-private" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

# Counts one build's results into passed, skipped and total.
passed=0 skipped=0 total=0
count_results() {  # build-dir
  local log="$1/meson-logs/testlog.json"
  [ -f "$log" ] || { echo "test: meson test wrote no $log"; summary "$passed" 1; }
  # One JSON object per line, each with "result": "OK" / "FAIL" / "SKIP" / ...
  local results
  results=$(grep -o '"result": *"[A-Z]*"' "$log" | sed 's/.*"\([A-Z]*\)"$/\1/')
  passed=$((passed + $(grep -cxE 'OK|EXPECTEDFAIL' <<<"$results")))
  skipped=$((skipped + $(grep -cx 'SKIP' <<<"$results")))
  total=$((total + $(grep -c . <<<"$results")))
}

start=$SECONDS
bash tools/setup.sh || { echo "test: set-up failed"; summary 0 1; }
phase_done set-up "$start"

start=$SECONDS
configure "$native" || { echo "test: meson setup of $native failed"; summary 0 1; }
ninja -C "$native" || { echo "test: build of $native failed"; summary 0 1; }
phase_done "$native build" "$start"
start=$SECONDS
rm -f "$native/meson-logs/testlog.json"
meson test -C "$native" --print-errorlogs
count_results "$native"
phase_done "$native tests" "$start"

# Without AVX-512 the native build already is the AVX2+FMA build: the same
# code paths, so the portable variant would only repeat them.
# grep reads all of the compiler's output: with -q it would stop at the match,
# and c++, writing on into a closed pipe, would fail the pipeline (pipefail),
# leaving an AVX-512 machine's AVX2 paths untested, as it did at random.
if echo | c++ -march=native -dM -E - | grep '__AVX512F__' >/dev/null; then
  start=$SECONDS
  # The cuda simulator's kernels are plain C++ with no vector paths of their
  # own, tested in the native build; the portable build leaves them out.
  # A unity build even where an older build-x86-64-v3/ was not (a fresh one
  # is, by meson.build's defaults): it is built from scratch, not edited.
  configure "$portable" -Dmarch=x86-64-v3 -Dmpi=disabled -Dcuda=disabled -Dunity=on ||
    { echo "test: meson setup of $portable failed"; summary "$passed" 1; }
  ninja -C "$portable" "${portable_targets[@]}" || { echo "test: build of $portable failed"; summary "$passed" 1; }
  phase_done "$portable build" "$start"
  start=$SECONDS
  rm -f "$portable/meson-logs/testlog.json"
  suite_args=()
  for suite in "${portable_suites[@]}"; do suite_args+=(--suite "$suite"); done
  # OpenBLAS picks its kernels by the CPU it runs on; Haswell's are its AVX2+FMA ones.
  OPENBLAS_CORETYPE=Haswell meson test -C "$portable" --no-rebuild --print-errorlogs "${suite_args[@]}"
  count_results "$portable"
  phase_done "$portable tests" "$start"
else
  echo "test: no AVX-512 here: $native is the AVX2+FMA build, so $portable is not built"
fi

# The nvidia runtime: compile and link it (no GPU here to run it), then check
# every kernel's registers, spills and local memory on sm_80/90/100.
nvidia=build-nvidia
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if command -v nvcc >/dev/null; then
  start=$SECONDS
  total=$((total + 1))
  # Host code at -O1: nothing here runs it (no GPU), and it was most of this
  # build's compile time; device code is what nvcc optimises itself (its -O
  # is the host compiler's), so the kernels' registers, spills and local
  # memory checked below are the release build's. tools/gpu_check.sh, which
  # runs on a GPU, builds its own at -O3.
  # With NCCL (the toolkit's), the NCCL backend's GPU suite is compiled and
  # linked too; it runs on a GPU (tools/gpu_check.sh --stages nccl). The
  # build prints ptxas's report of every kernel (-Dgpu_resource_report);
  # ninja's output, saved, is what the check reads, so that it need not
  # compile the kernels again (the test kernels are built for it too). The
  # report stays out of this output: thousands of lines.
  nvidia_targets=(libtessera.a examples/gpt/train tests/cuda/test_cuda tests/cuda/libmma_test_kernels.a)
  nvidia_log=$nvidia/ninja-output.log
  configured=0
  # Host code in unity groups as in any fresh build (the .cu files stay one a compile: meson.build).
  if configure "$nvidia" -Dgpu_runtime=nvidia --buildtype=plain -Doptimization=1 -Db_ndebug=true -Dmpi=disabled \
    -Dgpu_resource_report=true -Dunity=on; then
    configured=1
    ninja -C "$nvidia" -t targets all | grep -q '^tests/dist/test_nccl:' && nvidia_targets+=(tests/dist/test_nccl)
  fi
  if [ $configured -eq 1 ] &&
    ninja -C "$nvidia" "${nvidia_targets[@]}" | tee "$nvidia_log" | sed '/^ptxas info/d; /bytes stack frame/d' &&
    python3 tools/check_cuda_resources.py "$nvidia" "$nvidia_log" | tail -1; then
    passed=$((passed + 1))
  else
    echo "test: $nvidia failed (build or tools/check_cuda_resources.py)"
  fi
  phase_done "$nvidia build and resource check" "$start"
else
  echo "test: nvcc not found: the nvidia runtime was not compiled (the simulator's suite ran)"
fi

[ "$skipped" -eq 0 ] || echo "$skipped skipped"
summary "$passed" $((total - passed - skipped))
