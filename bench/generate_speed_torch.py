#!/usr/bin/env python3
"""transformers' GPT2LMHeadModel.generate on the CPU, the figures bench/generate_speed prints for tessera.

GPT-2 124M (GPT2Config's defaults, random init, f32), greedy (do_sample=False), use_cache=True, the same
prompt ((i * 7919 + 13) mod 50257 for i < --prompt-tokens), --new-tokens new tokens (min_new_tokens holds
generation to exactly that many), at torch.set_num_threads 1 and 2. Wall time of one run after a short
warm-up, as the C++ bench times. Needs torch and transformers.

--save DIR writes the random model as a Hugging Face directory first, for `generate_speed --init-from DIR`:
both then run the same weights. --model-dir DIR times a saved one instead. The FNV-1a digest of the prompt and
its continuation is the one the C++ bench prints.
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
    return seconds, output[0].tolist()


def token_digest(tokens):
    digest = 14695981039346656037
    for token in tokens:
        digest = ((digest ^ int(token)) * 1099511628211) % (1 << 64)
    return digest


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--save", metavar="DIR", help="write the random model here first (save_pretrained)")
    weights.add_argument("--model-dir", metavar="DIR", help="time this saved GPT-2 instead of a random one")
    args = parser.parse_args()

    if args.model_dir:
        model = GPT2LMHeadModel.from_pretrained(args.model_dir).eval()
    else:
        torch.manual_seed(1234)
        model = GPT2LMHeadModel(GPT2Config()).eval()
        if args.save:
            model.save_pretrained(args.save)
    prompt = torch.tensor([[(i * 7919 + 13) % 50257 for i in range(args.prompt_tokens)]])
    source = args.model_dir or "random init"
    print(f"generate_speed_torch: GPT-2 124M ({source}, f32), greedy, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"attention {model.config._attn_implementation}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        time_generation(model, prompt, 8)  # warm-up
        seconds, tokens = time_generation(model, prompt, args.new_tokens)
        print(f"threads {threads}: transformers generate (use_cache=True) {args.new_tokens / seconds:8.2f} tokens/s "
              f"({seconds:.2f} s), token digest {token_digest(tokens):016x}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
