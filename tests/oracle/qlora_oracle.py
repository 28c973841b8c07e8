#!/usr/bin/env python3
"""QLoRA on a Hugging Face Llama tessera has never seen, checked by transformers.

  python3 tests/oracle/qlora_oracle.py write-unseen DIR
      Saves a random LlamaForCausalLM with save_pretrained in bfloat16, with
      shapes no golden model has (width 80: rows of 80 weights are two NF4
      blocks, the second partial; 5 query heads over 1 key/value head; SwiGLU
      136; vocab 256, so byte-level text trains it), and no tokenizer.
  python3 tests/oracle/qlora_oracle.py check-export EXPORT_DIR PROMPT CONTINUATION_FILE
      Loads tessera's merged export (train --init-from DIR --lora R --nf4
      --export EXPORT_DIR --format hf) with from_pretrained, asserts it reports
      no missing, unexpected or mismatched key, greedily continues the bytes of
      PROMPT for as many tokens as CONTINUATION_FILE holds (what tessera's
      `generate --temperature 0` printed) and asserts the same bytes, reporting
      the smallest top-2 logit margin met (rounding cannot flip a step whose
      margin is far above float32's error).
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 20261130


def write_unseen(out_dir):
    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=256, hidden_size=80, intermediate_size=136, num_hidden_layers=2,
                         num_attention_heads=5, num_key_value_heads=1, max_position_embeddings=128,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, 0.25)
            if name.endswith("norm.weight"):
                parameter.add_(1.0)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    print(f"OK wrote {out_dir}: {sum(p.numel() for p in model.parameters())} parameters, bfloat16")


def check_export(export_dir, prompt, continuation_file):
    model, info = LlamaForCausalLM.from_pretrained(export_dir, output_loading_info=True, dtype=torch.float32)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[key], f"{export_dir}: {key} {info[key]}"
    model.eval()
    expected = open(continuation_file, "rb").read()
    ids = list(prompt.encode())
    smallest_margin = float("inf")
    with torch.no_grad():
        for _ in range(len(expected)):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2).values
            smallest_margin = min(smallest_margin, float(top[0] - top[1]))
            ids.append(int(torch.argmax(logits)))
    generated = bytes(ids[len(prompt.encode()):])
    assert generated == expected, f"transformers continues {generated!r}, tessera {expected!r}"
    print(f"OK {export_dir}: loads with no missing, unexpected or mismatched key; greedy continuation of "
          f"{prompt!r} equals tessera's for {len(expected)} tokens ({generated!r}); smallest top-2 margin "
          f"{smallest_margin:.4f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write-unseen":
        write_unseen(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check-export":
        check_export(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
