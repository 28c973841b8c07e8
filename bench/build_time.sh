#!/usr/bin/env bash
# How long a fresh clone takes to build and test: the first run's build (the
# `train` program, what tools/first_run.sh builds) and the whole test command
# (tools/test.sh), phase by phase, with no compiler cache. Optionally under
# load: another full build of tessera sharing the cores from start to end, as
# on a busy CI machine. Prints each phase, the slowest compile units (from
# ninja's log) and the load average seen; leaves the logs in the work folder.
#   bench/build_time.sh [--what first-run|test|both] [--load] [--work DIR] [--rev REV]
# REV (default HEAD) is cloned from this repository; DIR (default a fresh
# temporary folder) receives the clone, the logs and, with --load, the
# loading build's clone. Takes as long as what it measures: about half an
# hour for `test` on 2 cores.
set -euo pipefail

what=both
load=0
work=
rev=HEAD
while [ $# -gt 0 ]; do
  case $1 in
    --what) what=$2; shift 2 ;;
    --load) load=1; shift ;;
    --work) work=$2; shift 2 ;;
    --rev) rev=$2; shift 2 ;;
    *) echo "usage: $0 [--what first-run|test|both] [--load] [--work DIR] [--rev REV]" >&2; exit 2 ;;
  esac
done
case $what in first-run | test | both) ;; *) echo "build_time: --what must be first-run, test or both" >&2; exit 2 ;; esac
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse --short "$rev")
[ -n "$work" ] || work=$(mktemp -d /tmp/tessera-build-time.XXXXXX)
mkdir -p "$work"
export CCACHE_DISABLE=1  # every unit compiled, as on a fresh CI machine

clone() {  # folder
  rm -rf "$1"
  git clone --quiet --no-checkout "$repo" "$1"
  git -C "$1" checkout --quiet "$commit"
}

# The loading build: a full build of its own clone, started again whenever it ends.
loader_pid=
start_load() {
  clone "$work/load"
  (
    cd "$work/load"
    while true; do
      rm -rf build-load
      meson setup build-load >/dev/null 2>&1 && ninja -C build-load >/dev/null 2>&1 || true
    done
  ) &
  loader_pid=$!
}
stop_load() {
  [ -n "$loader_pid" ] || return 0
  pkill -P "$loader_pid" >/dev/null 2>&1 || true
  kill "$loader_pid" >/dev/null 2>&1 || true
  pkill -f "$work/load" >/dev/null 2>&1 || true
  wait "$loader_pid" 2>/dev/null || true
}
trap stop_load EXIT

# Samples the 1-minute load average every 10 s into a file, until killed.
sample_load() {  # file
  while true; do cut -d' ' -f1 /proc/loadavg >>"$1"; sleep 10; done
}
load_summary() {  # file
  sort -n "$1" | awk '{v[NR]=$1} END {if (NR) printf "load average %.1f-%.1f (median %.1f, %d samples)", v[1], v[NR], v[int((NR+1)/2)], NR}'
}

slowest_units() {  # build-dir count
  awk 'NR > 1 {printf "%8.1f s  %s\n", ($2 - $1) / 1000, $4}' "$1/.ninja_log" | sort -rn | head -n "$2"
}

echo "build_time: commit $commit, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
  "$(echo | c++ -march=native -dM -E - | grep __AVX512F__ >/dev/null && echo AVX-512 || echo 'AVX2, no AVX-512 (as the compiler sees it)'); work folder $work"
[ $load -eq 0 ] || { start_load; echo "build_time: loading the cores with another full build ($work/load)"; }

if [ "$what" != test ]; then
  clone "$work/first-run"
  : >"$work/first-run.load"
  sample_load "$work/first-run.load" &
  sampler=$!
  start=$SECONDS
  (cd "$work/first-run" && meson setup build >"$work/first-run.setup.log" 2>&1 &&
    ninja -C build examples/gpt/train >"$work/first-run.build.log" 2>&1) ||
    { kill $sampler; echo "build_time: the first run's build failed: $work/first-run.build.log"; exit 1; }
  seconds=$((SECONDS - start))
  kill $sampler
  printf 'build_time: first run: configure and build train: %d s, %d warnings; %s\n' "$seconds" \
    "$(grep -c 'warning:' "$work/first-run.build.log" || true)" "$(load_summary "$work/first-run.load")"
  echo "build_time: its slowest units:"
  slowest_units "$work/first-run/build" 8
fi

if [ "$what" != first-run ]; then
  clone "$work/test"
  : >"$work/test.load"
  sample_load "$work/test.load" &
  sampler=$!
  start=$SECONDS
  status=0
  (cd "$work/test" && bash tools/test.sh >"$work/test.log" 2>&1) || status=$?
  seconds=$((SECONDS - start))
  kill $sampler
  printf 'build_time: test command: %d s (%d.%d minutes), exit %d; %s\n' "$seconds" $((seconds / 60)) \
    $((seconds % 60 * 10 / 60)) \
    "$status" "$(load_summary "$work/test.load")"
  grep '^test: phases:' "$work/test.log" | sed 's/^test: /build_time: /'
  echo "build_time: $(tail -n 1 "$work/test.log")"
  echo "build_time: the native build's slowest units:"
  slowest_units "$work/test/build" 8
fi
