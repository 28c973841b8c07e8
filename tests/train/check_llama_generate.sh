#!/usr/bin/env bash
# A Llama end to end through the programs: `train --model llama` on 2 ranks
# checkpoints and exports it, and `generate` rebuilds it from either file
# (the config there says "llama") and prints the same greedy continuation.
# Usage: check_llama_generate.sh path/to/train path/to/generate
set -euo pipefail
train=$1
generate=$2
dir=$(mktemp -d /tmp/tessera-llama-XXXXXX)
trap 'rm -rf "$dir"' EXIT

"$train" --model llama --preset llama-nano --nproc 2 --steps 3 --batch 4 --eval-every 0 \
  --ckpt-dir "$dir/ckpt" --export "$dir/llama.safetensors" >"$dir/train.log" ||
  { echo "train --model llama failed:"; cat "$dir/train.log"; exit 1; }
grep -qF "model    llama-nano (llama)" "$dir/train.log" ||
  { echo "no Llama in the log:"; cat "$dir/train.log"; exit 1; }

from_export=$("$generate" --init-from "$dir/llama.safetensors" --prompt "The " --max-new-tokens 16 \
  --temperature 0 2>"$dir/export.err")
from_checkpoint=$("$generate" --ckpt "$dir/ckpt" --prompt "The " --max-new-tokens 16 --temperature 0 \
  2>"$dir/ckpt.err")
[ "$from_export" = "$from_checkpoint" ] ||
  { echo "the export and the checkpoint continue differently:"; echo "$from_export"; echo "$from_checkpoint"; exit 1; }
[ "${#from_export}" -gt 4 ] || { echo "no continuation: '$from_export'"; exit 1; }
grep -qF "step 3" "$dir/export.err" || { echo "generate does not say the step:"; cat "$dir/export.err"; exit 1; }
echo "train --model llama and generate from its checkpoint and export: as expected"
