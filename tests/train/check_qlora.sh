#!/usr/bin/env bash
# QLoRA through the programs: `train --init-from` the golden llama_eos (whose
# greedy continuation of any prompt is one sentence, then <|eot|>) with
# --lora 2 --nf4 on 3 ranks says what it tunes, and its Hugging Face export
# holds the merged weights under the base's names and no adapter; `generate`
# from the export still says the sentence and stops at end-of-text.
# Usage: check_qlora.sh path/to/train path/to/generate tests/oracle/golden/hf
set -euo pipefail
train=$1
generate=$2
golden=$3/llama_eos
dir=$(mktemp -d /tmp/tessera-qlora-XXXXXX)
trap 'rm -rf "$dir"' EXIT

"$train" --init-from "$golden" --lora 2 --nf4 --nproc 3 --steps 3 --batch 2 --seq-len 32 --eval-every 0 \
  --export "$dir/export" --format hf >"$dir/train.log" 2>&1 ||
  { echo "train --lora 2 --nf4 failed:"; cat "$dir/train.log"; exit 1; }
grep -qF "tune     LoRA rank 2 (alpha 4) on every block projection, everything else frozen, the projections in NF4" \
  "$dir/train.log" || { echo "the run does not say what it tunes:"; cat "$dir/train.log"; exit 1; }

# The safetensors header (its first 8 bytes are its length) names the tensors.
header=$(head -c 65536 "$dir/export/model.safetensors" | tail -c +9 | tr -d '\0')
grep -qF '"model.layers.0.self_attn.q_proj.weight"' <<<"$header" ||
  { echo "the export lacks q_proj's weight"; exit 1; }
! grep -qiF 'lora' <<<"$header" || { echo "the export holds adapter tensors"; exit 1; }

prompt="Once upon a time"
text=$("$generate" --init-from "$dir/export" --prompt "$prompt" --temperature 0 --max-new-tokens 32 \
  2>"$dir/generate.err")
[ "$text" = "$prompt The tessellation ends here.<|eot|>" ] ||
  { echo "the QLoRA export does not end its sentence at <|eot|>: '$text'"; cat "$dir/generate.err"; exit 1; }
echo "train --lora 2 --nf4 on 3 ranks, exported merged as a Hugging Face directory, generates to end-of-text"
