#!/usr/bin/env bash
# train --tokenizer, then generate --tokenizer, through the programs: a GPT
# trained on the BPE tokens of a text (the GPT-2 style tokenizer of
# tests/oracle/golden/tokenizer, 659 ids) says so in its banner, caches the
# tokens in its checkpoint root and reads them back on --resume; generate
# continues a prompt through the same tokenizer (the raw output starts with
# the prompt's bytes, UTF-8 included), and refuses the model without a
# tokenizer or with another one (exit 1, naming the vocab sizes).
# Usage: check_tokenizer_generate.sh path/to/train path/to/generate GOLDEN_DIR
set -euo pipefail
train=$1
generate=$2
golden=$3
dir=$(mktemp -d /tmp/tessera-tokenizer-XXXXXX)
trap 'rm -rf "$dir"' EXIT

for i in $(seq 1 300); do printf 'Line %d: the caf\xc3\xa9 serves \xe6\x97\xa5\xe6\x9c\xac tea; it'"'"'s fine.\n' "$i"; done >"$dir/text.txt"
fail() { echo "$1"; cat "$2"; exit 1; }

"$train" --tokenizer "$golden/gpt2/tokenizer.json" --data "$dir/text.txt" --steps 2 --batch 4 --seq-len 16 \
  --eval-every 0 --ckpt-dir "$dir/ckpt" >"$dir/train.log" 2>&1 || fail "train --tokenizer failed:" "$dir/train.log"
grep -qF "vocab 659" "$dir/train.log" || fail "the vocab is not the tokenizer's:" "$dir/train.log"
grep -qF "tokens cached in $dir/ckpt/tokens-v1-" "$dir/train.log" || fail "no token cache:" "$dir/train.log"
"$train" --tokenizer "$golden/gpt2/tokenizer.json" --data "$dir/text.txt" --steps 3 --batch 4 --seq-len 16 \
  --eval-every 0 --ckpt-dir "$dir/ckpt" --resume >"$dir/resume.log" 2>&1 || fail "--resume failed:" "$dir/resume.log"
grep -qF "tokens read from the cache $dir/ckpt/tokens-v1-" "$dir/resume.log" || fail "cache not reused:" "$dir/resume.log"

prompt=$'Le caf\xc3\xa9'
"$generate" --ckpt "$dir/ckpt" --tokenizer "$golden/gpt2/tokenizer.json" --prompt "$prompt" --max-new-tokens 8 \
  --temperature 0 >"$dir/out.bin" 2>"$dir/generate.err" || fail "generate --tokenizer failed:" "$dir/generate.err"
head -c "$(printf '%s' "$prompt" | wc -c)" "$dir/out.bin" | cmp -s - <(printf '%s' "$prompt") ||
  fail "the output does not start with the prompt's bytes:" "$dir/out.bin"

status=0
"$generate" --ckpt "$dir/ckpt" --prompt "x" --max-new-tokens 1 >/dev/null 2>"$dir/bytes.err" || status=$?
[ "$status" = 1 ] && grep -qF "vocab_size is 659" "$dir/bytes.err" || fail "generate without --tokenizer:" "$dir/bytes.err"
status=0
"$generate" --ckpt "$dir/ckpt" --tokenizer "$golden/llama3/tokenizer.json" --prompt "x" --max-new-tokens 1 \
  >/dev/null 2>"$dir/other.err" || status=$?
[ "$status" = 1 ] && grep -qF "has 665 ids" "$dir/other.err" || fail "generate with another tokenizer:" "$dir/other.err"
echo "train and generate --tokenizer: as expected"
