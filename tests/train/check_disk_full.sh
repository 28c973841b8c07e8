#!/usr/bin/env bash
# Runs the "disk full" cases of test_train on a real, small filesystem: a
# tmpfs mounted in a private mount namespace (unshare), so it vanishes with
# the test however the test ends, and nothing outside the namespace sees it.
# Root, or unprivileged user namespaces, can do that; otherwise the check is
# skipped (exit 77) with the reason.
# Usage: check_disk_full.sh path/to/test_train [tmpfs size, default 4m]
set -euo pipefail
tests=$1
size=${2:-4m}
mount_point=$(mktemp -d)
trap 'rmdir "$mount_point" 2>/dev/null || true' EXIT
namespace=(unshare --mount)
[ "$(id -u)" -eq 0 ] || namespace=(unshare --user --map-root-user --mount)
if ! "${namespace[@]}" mount -t tmpfs -o "size=$size" tmpfs "$mount_point" 2>/tmp/tessera-unshare.$$; then
  echo "disk full: skipped: cannot mount a tmpfs in a private mount namespace: $(cat /tmp/tessera-unshare.$$)"
  rm -f /tmp/tessera-unshare.$$
  exit 77
fi
rm -f /tmp/tessera-unshare.$$
exec "${namespace[@]}" bash -c 'mount -t tmpfs -o "size=$1" tmpfs "$2" && TESSERA_TEST_TMPFS="$2" "$3" --no-skip -tc="disk full*"' \
  bash "$size" "$mount_point" "$tests"
