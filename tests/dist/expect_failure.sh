#!/usr/bin/env bash
# Runs a command that must fail, for failure paths that end a whole job (an
# MPI abort): passes only when the command exits non-zero and its output
# (stdout and stderr) contains every --expect text.
# usage: expect_failure.sh [--expect TEXT]... -- COMMAND [ARG]...
set -uo pipefail

expected=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --expect) expected+=("$2"); shift 2 ;;
    *) echo "expect_failure: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ $# -gt 1 ] || { echo "expect_failure: no command after --" >&2; exit 2; }
shift

output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ "$status" -eq 0 ]; then
  echo "expect_failure: the command succeeded but should have failed" >&2
  exit 1
fi
for text in "${expected[@]}"; do
  if ! grep -qF -- "$text" <<<"$output"; then
    echo "expect_failure: the output lacks: $text" >&2
    exit 1
  fi
done
echo "expect_failure: failed as expected (exit status $status) with every expected message"
