#!/usr/bin/env bash
# generate's KV cache, batch and stop flags through the program: with and
# without the cache the same text (greedy and sampled, past block_size);
# --prompts-file prints one escaped line per prompt, the first as --prompt
# alone prints it; --stop ends a sequence at its first stop token, kept as
# its last; bad --prompts-file lines, --stop texts of more than one token,
# --stop-id past the vocabulary and --top-p outside (0, 1] exit 2 with the
# flag named.
# Usage: check_generate_batch.sh path/to/train path/to/generate
set -euo pipefail
train=$1
generate=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "generate batch: $*"; exit 1; }

printf 'the quick brown fox jumps over the lazy dog\n%.0s' $(seq 1 100) >"$work/c.txt"
# nano's block_size is 32: 40 new tokens cross it.
"$train" --preset nano --seq-len 16 --batch 4 --steps 30 --eval-every 0 --data "$work/c.txt" \
  --export "$work/m.safetensors" >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "train failed"; }
model=(--init-from "$work/m.safetensors" --threads 1 --max-new-tokens 40)

for sampling in "--temperature 0" "--temperature 1 --top-k 0 --top-p 0.9 --seed 7"; do
  # shellcheck disable=SC2086  # the sampling flags split into words
  cached=$("$generate" "${model[@]}" --prompt "the " $sampling 2>"$work/cached.err")
  # shellcheck disable=SC2086
  uncached=$("$generate" "${model[@]}" --prompt "the " $sampling --no-kv-cache 2>"$work/uncached.err")
  [ "$cached" = "$uncached" ] || fail "$sampling: the cache changed the text: '$cached' vs '$uncached'"
  grep -qF "(KV cache)" "$work/cached.err" || fail "the cached run does not say so: $(cat "$work/cached.err")"
  grep -qF "(no KV cache)" "$work/uncached.err" || fail "--no-kv-cache does not say so: $(cat "$work/uncached.err")"
done

# A batch: one escaped line per prompt, in order; prompt 0 as alone, the others from their own streams.
printf 'the \nq\\x0az\nlazy dog \n' >"$work/prompts.txt"
"$generate" "${model[@]}" --prompts-file "$work/prompts.txt" --seed 5 >"$work/batch.out" 2>"$work/batch.err" ||
  { cat "$work/batch.err"; fail "--prompts-file failed"; }
[ "$(wc -l <"$work/batch.out")" = 3 ] || fail "3 prompts, not 3 lines: $(cat "$work/batch.out")"
alone=$("$generate" "${model[@]}" --prompt "the " --seed 5 --escape 2>/dev/null)
[ "$(sed -n 1p "$work/batch.out")" = "${alone//$'\n'/\\x0a}" ] || fail "prompt 0 differs from its run alone"
sed -n 2p "$work/batch.out" | grep -q '^q\\x0az' || fail "line 2 does not start with its prompt: $(sed -n 2p "$work/batch.out")"
grep -qF "120 tokens for 3 prompts" "$work/batch.err" || fail "the count: $(cat "$work/batch.err")"
uncached=$("$generate" "${model[@]}" --prompts-file "$work/prompts.txt" --seed 5 --no-kv-cache 2>/dev/null)
[ "$uncached" = "$(cat "$work/batch.out")" ] || fail "the batch without the cache differs"

# --stop: the text up to and including the first stop token after the prompt.
# Sampled among the 5 likeliest bytes (the corpus's letters and space), so
# the continuation varies and the third new byte is plain ASCII.
sampled=(--temperature 1 --top-k 5 --seed 3 --escape)
free=$("$generate" "${model[@]}" --prompt "the " "${sampled[@]}" 2>/dev/null)
continuation=${free#the }
stop=${continuation:2:1}  # the third new byte
[[ "$stop" =~ ^[a-z]$ || "$stop" == " " ]] || fail "the third new byte of '$free' is not a letter or a space"
stopped=$("$generate" "${model[@]}" --prompt "the " "${sampled[@]}" --stop "$stop" 2>/dev/null)
expected="the ${continuation%%"$stop"*}$stop"
[ "$stopped" = "$expected" ] || fail "--stop '$stop': '$stopped', expected '$expected'"
[ "${#stopped}" -lt "${#free}" ] || fail "--stop '$stop' did not stop: '$stopped'"
code=$(printf '%d' "'$stop")
by_id=$("$generate" "${model[@]}" --prompt "the " "${sampled[@]}" --stop-id "$code" 2>/dev/null)
[ "$by_id" = "$expected" ] || fail "--stop-id $code: '$by_id', expected '$expected'"

program=$generate
source "$(dirname "$0")/expect_failure.sh"
expect_failure "--stop 'ab' is 2 tokens [97, 98], not one" "${model[@]}" --stop ab
expect_failure "--stop '' is 0 tokens" "${model[@]}" --stop ''
expect_failure "--stop-id 256: the model's vocabulary is [0, 256)" "${model[@]}" --stop-id 256
expect_failure "--top-p: must be in (0, 1], got 0" "${model[@]}" --top-p 0
expect_failure "--top-p: must be in (0, 1], got 1.5" "${model[@]}" --top-p 1.5
printf 'one\n\nthree\n' >"$work/empty-line.txt"
expect_failure "line 2 is empty" "${model[@]}" --prompts-file "$work/empty-line.txt"
printf 'ok\nbad \\q escape\n' >"$work/bad-escape.txt"
expect_failure "--prompts-file $work/bad-escape.txt: line 2:" "${model[@]}" --prompts-file "$work/bad-escape.txt"
expect_failure "--prompt excludes --prompts-file" "${model[@]}" --prompts-file "$work/prompts.txt" --prompt x
for args in "--stop ab" "--stop-id 256" "--top-p 0" "--prompts-file $work/empty-line.txt"; do
  status=0
  # shellcheck disable=SC2086
  "$generate" "${model[@]}" $args >/dev/null 2>&1 || status=$?
  [ "$status" = 2 ] || fail "$args: exit $status, expected 2"
done
echo "generate: the cache, batches and stops as expected"
