#!/usr/bin/env bash
# QLoRA on a Hugging Face Llama tessera has never seen, end to end, checked by
# transformers (needs torch and transformers: pip install torch transformers).
# tests/oracle/qlora_oracle.py writes a random bf16 Llama (width 80, 5 heads
# over 1 key/value head, SwiGLU 136, vocab 256, no tokenizer); `train
# --init-from it --lora 4 --nf4` runs 30 steps on 1, 2, 3 and 8 ranks with the
# same global batch (24 sequences of 64 bytes); the losses are compared; each
# merged export (--format hf) is loaded by transformers, whose greedy
# continuation must be tessera's `generate` output byte for byte.
# Usage: bench/qlora_unseen_llama.sh BUILD_DIR   (prints the log)
set -euo pipefail
build=$1
dir=$(mktemp -d /tmp/tessera-qlora-unseen-XXXXXX)
trap 'rm -rf "$dir"' EXIT
oracle=$(dirname "$0")/../tests/oracle/qlora_oracle.py
echo "commit $(git -C "$(dirname "$0")" rev-parse HEAD), $(date -u +%Y-%m-%d), $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
python3 "$oracle" write-unseen "$dir/llama" 2>/dev/null
for ranks in 1 2 3 8; do
  "$build/examples/gpt/train" --init-from "$dir/llama" --lora 4 --nf4 --nproc "$ranks" --steps 30 \
    --batch $((24 / ranks)) --seq-len 64 --eval-every 0 --warmup 5 --lr 3e-3 --log-json "$dir/log$ranks.jsonl" \
    --export "$dir/export$ranks" --format hf >"$dir/train$ranks.log" 2>&1
  echo "--nproc $ranks --batch $((24 / ranks)): $(grep -E '^tune' "$dir/train$ranks.log" | cut -c10-)"
  grep -E '^step +(1|30) ' "$dir/train$ranks.log" | cut -d'|' -f1-2
  "$build/examples/gpt/generate" --init-from "$dir/export$ranks" --prompt "The " --temperature 0 \
    --max-new-tokens 24 2>/dev/null | tail -c +5 >"$dir/continuation$ranks.bin"
  python3 "$oracle" check-export "$dir/export$ranks" "The " "$dir/continuation$ranks.bin" 2>/dev/null
done
python3 - "$dir" <<'PY'
import json, sys
losses = {n: [json.loads(line)["loss"] for line in open(f"{sys.argv[1]}/log{n}.jsonl")] for n in (1, 2, 3, 8)}
for n in (2, 3, 8):
    worst = max(abs(a - b) for a, b in zip(losses[1], losses[n]))
    print(f"losses of {n} ranks against 1 rank over {len(losses[n])} steps: largest difference {worst:.3g}")
PY
