#!/usr/bin/env bash
# The exit status of `train` and `generate`, as docs/training.md lists them: 0 done,
# 1 failed after starting, 2 a usage error of any kind (CLI11's own codes,
# 105 or 109, never leak), 75 stopped by a signal after saving (and 128 + N,
# tested in check_graceful_stop.sh); and generate's output: the model's bytes
# unchanged into a pipe or a file (all 256 byte values round-trip), escaped
# reversibly on request.
# Usage: check_exit_codes.sh path/to/train path/to/generate
set -euo pipefail
train=$1
generate=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "exit codes: $*"; exit 1; }

expect_status() {  # status program args...
  local expected=$1 status=0
  shift
  "$@" >"$work/out" 2>&1 || status=$?
  [ "$status" -eq "$expected" ] || { cat "$work/out"; fail "$(basename "$1") ${*:2}: exit $status, expected $expected"; }
}

printf 'the quick brown fox jumps over the lazy dog\n%.0s' $(seq 1 100) >"$work/c.txt"
quick=(--preset nano --seq-len 16 --batch 4 --eval-every 0 --data "$work/c.txt")

expect_status 0 "$train" --help
expect_status 0 "$train" --plan --preset nano
expect_status 2 "$train" --no-such-flag
expect_status 2 "$train" --batch 0
expect_status 2 "$train" --grad-accum 9223372036854775807
expect_status 2 "$train" --steps
expect_status 2 "$train" --ckpt-dir ''
expect_status 2 "$train" --export ''
expect_status 2 "$train" --nproc 1000
expect_status 2 "$train" "${quick[@]}" --log-json "$work/c.txt"
expect_status 2 "$train" --preset nano --data "$work/absent.txt"
expect_status 2 "$train" "${quick[@]}" --export /dev/null
TESSERA_DIST_TIMEOUT_S=inf expect_status 2 "$train" "${quick[@]}" --steps 1
cmp -s "$work/c.txt" <(printf 'the quick brown fox jumps over the lazy dog\n%.0s' $(seq 1 100)) ||
  fail "a refused run changed its corpus"
expect_status 0 "$train" "${quick[@]}" --steps 2 --export "$work/m.safetensors"
printf 'not a safetensors file' >"$work/bad.safetensors"
expect_status 1 "$train" "${quick[@]}" --steps 2 --init-from "$work/bad.safetensors"

expect_status 0 "$generate" --help
expect_status 2 "$generate" --prompt x
expect_status 2 "$generate" --ckpt a --init-from b.safetensors
expect_status 2 "$generate" --init-from ''
expect_status 2 "$generate" --init-from "$work/m.safetensors" --top-k 1e9
expect_status 1 "$generate" --init-from "$work/bad.safetensors"
expect_status 2 "$generate" --init-from "$work/m.safetensors" --prompt-file "$work/absent"

# Every byte value, NUL included, through the prompt and back out of a pipe and a file.
python_free_bytes() { for value in $(seq 0 255); do printf "\\$(printf '%03o' "$value")"; done; }
python_free_bytes >"$work/all-bytes"
[ "$(wc -c <"$work/all-bytes")" -eq 256 ] || fail "the test's own 256 bytes came out wrong"
"$generate" --init-from "$work/m.safetensors" --prompt-file "$work/all-bytes" --max-new-tokens 0 \
  2>"$work/err" | cat >"$work/piped" || { cat "$work/err"; fail "generate into a pipe failed"; }
cmp "$work/all-bytes" "$work/piped" || fail "the piped output is not the prompt's 256 bytes"
"$generate" --init-from "$work/m.safetensors" --prompt-file "$work/all-bytes" --max-new-tokens 0 \
  >"$work/file" 2>"$work/err" || { cat "$work/err"; fail "generate into a file failed"; }
cmp "$work/all-bytes" "$work/file" || fail "the file output is not the prompt's 256 bytes"
# A continuation is bytes too: as many as asked for after the prompt.
"$generate" --init-from "$work/m.safetensors" --prompt "ab" --max-new-tokens 40 --seed 3 >"$work/sampled" 2>"$work/err"
[ "$(wc -c <"$work/sampled")" -eq 42 ] || fail "expected 2 + 40 bytes, got $(wc -c <"$work/sampled")"
# Escaped on request: a backslash and a byte that is not printable are told apart.
escaped=$("$generate" --init-from "$work/m.safetensors" --prompt 'a\xff' --max-new-tokens 0 --escape 2>/dev/null)
[ "$escaped" = 'a\\xff' ] || fail "--escape of the text 'a\\xff' gave '$escaped'"
printf 'a\377' >"$work/byte"
escaped=$("$generate" --init-from "$work/m.safetensors" --prompt-file "$work/byte" --max-new-tokens 0 --escape 2>/dev/null)
[ "$escaped" = 'a\xff' ] || fail "--escape of the byte 0xff gave '$escaped'"
# What generate reads is not where its output goes.
cp "$work/m.safetensors" "$work/m2.safetensors"
status=0
"$generate" --init-from "$work/m2.safetensors" --max-new-tokens 1 >>"$work/m2.safetensors" 2>"$work/err" || status=$?
[ "$status" -eq 2 ] && grep -qF "standard output" "$work/err" || { cat "$work/err"; fail "output appended to the model"; }
cmp -s "$work/m.safetensors" "$work/m2.safetensors" || fail "the model changed"
echo "exit codes: train and generate exit 0, 1 and 2 as documented; generate's bytes round-trip"
