#!/usr/bin/env bash
# The project's test command: set-up, configure and build in build/, run every
# meson test, then print alone on the last line "N passed, N failed" (from
# build/meson-logs/testlog.json) and exit non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build

summary() {  # passed failed
  echo "$1 passed, $2 failed"
  [ "$2" -eq 0 ]
  exit $?
}

bash tools/setup.sh || { echo "test: set-up failed"; summary 0 1; }
if [ -d "$build/meson-private" ]; then
  meson setup --reconfigure "$build" >/dev/null || { echo "test: meson setup failed"; summary 0 1; }
else
  meson setup "$build" >/dev/null || { echo "test: meson setup failed"; summary 0 1; }
fi
ninja -C "$build" || { echo "test: build failed"; summary 0 1; }

rm -f "$build/meson-logs/testlog.json"
meson test -C "$build" --print-errorlogs
log="$build/meson-logs/testlog.json"
[ -f "$log" ] || { echo "test: meson test wrote no $log"; summary 0 1; }

# One JSON object per line, each with "result": "OK" / "FAIL" / "SKIP" / ...
results=$(grep -o '"result": *"[A-Z]*"' "$log" | sed 's/.*"\([A-Z]*\)"$/\1/')
passed=$(grep -cxE 'OK|EXPECTEDFAIL' <<<"$results")
skipped=$(grep -cx 'SKIP' <<<"$results")
total=$(grep -c . <<<"$results")
failed=$((total - passed - skipped))
[ "$skipped" -eq 0 ] || echo "$skipped skipped"
summary "$passed" "$failed"
