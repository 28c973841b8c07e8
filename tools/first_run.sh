#!/usr/bin/env bash
# README's command 1, after tools/setup.sh: builds only the `train` program
# and runs the default job (the tiny GPT on the Debian corpus, 4 ranks, 500
# steps), which ends by drawing its loss curve to build/first-run/loss.svg.
# The compiler's output goes to build/first-run/build.log, shown only when
# the build fails. Runnable again at any time: build/ is configured once
# (ninja reconfigures it by itself when a meson.build changed), a rerun
# rebuilds what changed and draws the picture anew. Arguments go to train
# (e.g. --steps 100); the whole project builds with `ninja -C build`.
# TESSERA_BUILD_DIR names another build directory (a scratch one, to time a
# fresh build without touching build/).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${TESSERA_BUILD_DIR:-build}
logs=$build/first-run
target=examples/gpt/train
plot=$logs/loss.svg

say() { printf 'first run: %s\n' "$*"; }

# The failing part of a log: from ninja's first FAILED line, else its end.
show_failure() {
  local log=$1
  if grep -q '^FAILED:' "$log"; then
    sed -n '/^FAILED:/,$p' "$log" | head -n 60
  else
    tail -n 40 "$log"
  fi
  say "the whole output is in $log"
}

# Copies ninja's output to the log; on a terminal, shows its [done/total]
# count on one line, rewritten in place.
progress() {
  local log=$1 start=$2 line
  : >"$log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [ -t 1 ] && [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      printf '\r  %s/%s build steps, %d s ' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" $((SECONDS - start))
    fi
  done
  if [ -t 1 ]; then printf '\r\033[K'; fi
}

mkdir -p "$logs"
if [ ! -f "$build/build.ninja" ]; then
  start=$SECONDS
  reconfigure=()
  if [ -d "$build/meson-private" ]; then reconfigure=(--reconfigure); fi  # an earlier setup that did not finish
  printf 'first run: configuring %s (meson setup) ... ' "$build"
  if ! meson setup "${reconfigure[@]}" "$build" >"$logs/setup.log" 2>&1; then
    echo "failed"
    show_failure "$logs/setup.log"
    exit 1
  fi
  echo "done in $((SECONDS - start)) s"
fi

start=$SECONDS
say "building $build/$target (only what train needs; a fresh build takes a few minutes)"
if ! ninja -C "$build" "$target" 2>&1 | progress "$logs/build.log" "$start"; then
  say "the build failed:"
  show_failure "$logs/build.log"
  exit 1
fi
if grep -q '^ninja: no work to do' "$logs/build.log"; then
  say "$build/$target is up to date"
else
  warnings=$(grep -c 'warning:' "$logs/build.log" || true)
  case $warnings in
    0) warnings="" ;;
    1) warnings="1 compiler warning, " ;;
    *) warnings="$warnings compiler warnings, " ;;
  esac
  say "built in $((SECONDS - start)) s (${warnings}the compiler's output is in $logs/build.log)"
fi

# The picture is this script's own output: a rerun replaces it.
rm -f "$plot"
say "training: $build/$target --nproc 4 --loss-plot $plot $*"
exec "$build/$target" --nproc 4 --loss-plot "$plot" "$@"
