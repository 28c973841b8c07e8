#!/usr/bin/env bash
# A Hugging Face model fine-tuned and exported keeps what generation needs.
# `train --init-from` the golden llama_eos (tests/oracle/hf_oracle.py: token
# ids with a list eos, generation_config.json, a tokenizer; its greedy
# continuation of any prompt is one sentence, then <|eot|>) for 2 steps, then
# `--export DIR --format hf`: DIR holds the ids, the generation config and
# the tokenizer's files byte for byte, and `generate --init-from DIR` reads
# its tokenizer and stops at its eos ids unless --stop-id says otherwise.
# Usage: check_hf_export_generate.sh path/to/train path/to/generate tests/oracle/golden/hf
set -euo pipefail
train=$1
generate=$2
golden=$3/llama_eos
dir=$(mktemp -d /tmp/tessera-hf-export-XXXXXX)
trap 'rm -rf "$dir"' EXIT
export=$dir/export

"$train" --init-from "$golden" --steps 2 --batch 4 --seq-len 32 --eval-every 0 --export "$export" --format hf \
  >"$dir/train.log" 2>&1 || { echo "train --init-from $golden failed:"; cat "$dir/train.log"; exit 1; }
for file in generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  cmp -s "$golden/$file" "$export/$file" || { echo "$export/$file: not the bytes of $golden/$file"; exit 1; }
done
tr -d ' \n' <"$export/config.json" | grep -qF '"bos_token_id":0,"eos_token_id":[1,2],"pad_token_id":null' ||
  { echo "config.json lost the token ids:"; cat "$export/config.json"; exit 1; }

prompt="Once upon a time"
sentence=" The tessellation ends here."
text=$("$generate" --init-from "$export" --prompt "$prompt" --temperature 0 --max-new-tokens 32 2>"$dir/generate.err")
[ "$text" = "$prompt$sentence<|eot|>" ] ||
  { echo "generate did not end at <|eot|>: '$text'"; cat "$dir/generate.err"; exit 1; }
grep -qF "stopping at $export's end-of-text ids 1, 2" "$dir/generate.err" &&
  grep -qF ": 11 tokens in" "$dir/generate.err" || { echo "no note of the eos ids:"; cat "$dir/generate.err"; exit 1; }

# --stop-id replaces the eos ids: the sentence's last token (".", id 17) ends it.
text=$("$generate" --init-from "$export" --prompt "$prompt" --temperature 0 --max-new-tokens 32 --stop-id 17 \
  2>"$dir/stop.err")
[ "$text" = "$prompt$sentence" ] || { echo "--stop-id 17 did not end at '.': '$text'"; exit 1; }
! grep -qF "end-of-text" "$dir/stop.err" || { echo "--stop-id still noted the eos ids:"; cat "$dir/stop.err"; exit 1; }
echo "train --init-from an HF directory, --export --format hf, generate from the export: ends at its eos ids"
