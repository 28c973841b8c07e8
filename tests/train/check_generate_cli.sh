#!/usr/bin/env bash
# The `generate` command line: number flags that are not finite, and a
# --max-new-tokens whose buffers cannot fit in memory, exit non-zero with a
# message naming the flag, before any model is loaded (--ckpt names no
# checkpoint here, so reaching the load would print a different error).
# Usage: check_generate_cli.sh path/to/generate
set -euo pipefail
generate=$1
missing=/nonexistent/tessera-checkpoint

# Each case: a piece of the message, then the flags.
program=$generate
source "$(dirname "$0")/expect_failure.sh"

# The issue's case: 99999999999 tokens need ~745 GiB (this fails only where
# more than twice that is available).
expect_failure "--max-new-tokens 99999999999: the tokens and their printed text need about" \
  --max-new-tokens 99999999999 --ckpt "$missing"
expect_failure "this machine allows at most --max-new-tokens" --max-new-tokens 99999999999 --ckpt "$missing"
expect_failure "--temperature: must be a finite number, got inf" --temperature inf --ckpt "$missing"
expect_failure "--temperature: must be a finite number, got nan" --temperature nan --ckpt "$missing"
expect_failure "--top-k: 'inf' is not an integer" --top-k inf --ckpt "$missing"
expect_failure "--temperature: must be in [0, 100], got -1" --temperature -1 --ckpt "$missing"
expect_failure "--top-k: must be in [0, 1048576], got 99999999999" --top-k 99999999999 --ckpt "$missing"
expect_failure "--top-p: must be a finite number, got nan" --top-p nan --ckpt "$missing"
expect_failure "--stop-id: must be in [0, 4294967295], got -1" --stop-id -1 --ckpt "$missing"
expect_failure "--max-new-tokens: must be in [0, 1099511627776], got 9223372036854775807" \
  --max-new-tokens 9223372036854775807 --ckpt "$missing"

# A sane length passes the check and reaches the model load, which fails on the missing checkpoint.
output=$("$generate" --max-new-tokens 10 --ckpt "$missing" 2>&1) && { echo "generate loaded $missing?"; exit 1; }
if grep -qF -- "--max-new-tokens" <<<"$output"; then echo "--max-new-tokens 10 was refused:"; echo "$output"; exit 1; fi
grep -qF -- "$missing" <<<"$output" || { echo "the load error does not name $missing:"; echo "$output"; exit 1; }
echo "generate: the flags' errors as expected"
