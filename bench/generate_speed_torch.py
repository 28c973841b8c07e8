#!/usr/bin/env python3
"""transformers' GPT2LMHeadModel.generate on the CPU, the figures bench/generate_speed prints for tessera.

GPT-2 124M (GPT2Config's defaults, random init, f32), greedy (do_sample=False), use_cache=True, the same
prompt ((i * 7919 + 13) mod 50257 for i < --prompt-tokens), --new-tokens new tokens (min_new_tokens holds
generation to exactly that many), at torch.set_num_threads 1 and 2. Wall time of one run after a short
warm-up, as the C++ bench times. Needs torch and transformers.
"""
import argparse
import os
import time

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel


def time_generation(model, prompt, new_tokens, use_cache=True):
    attention_mask = torch.ones_like(prompt)
    start = time.perf_counter()
    with torch.no_grad():
        output = model.generate(prompt, attention_mask=attention_mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache,
                                pad_token_id=model.config.eos_token_id)
    seconds = time.perf_counter() - start
    assert output.shape[1] == prompt.shape[1] + new_tokens, output.shape
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    torch.manual_seed(1234)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    prompt = torch.tensor([[(i * 7919 + 13) % 50257 for i in range(args.prompt_tokens)]])
    print(f"generate_speed_torch: GPT-2 124M (random init, f32), greedy, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"attention {model.config._attn_implementation}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        time_generation(model, prompt, 8)  # warm-up
        seconds = time_generation(model, prompt, args.new_tokens)
        print(f"threads {threads}: transformers generate (use_cache=True) {args.new_tokens / seconds:8.2f} tokens/s "
              f"({seconds:.2f} s)")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
