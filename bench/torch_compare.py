#!/usr/bin/env python3
"""tessera against PyTorch on this machine, in one run (optional: needs torch
and safetensors; never part of the test command).

1. GPT-2 124M, B=4, T=64, one training step (forward, backward, clipping,
   AdamW) at each --threads: tessera's build/bench/train_step against PyTorch
   eager running the same model on the same weights (tessera's safetensors
   export, loaded by name) with the same thread count.
2. The tiny preset on 4 ranks: tessera's `train --nproc 4` (FSDP over local
   threads) against PyTorch FSDP2 (fully_shard per block, then the root) on
   gloo with 4 processes, each with the thread share tessera gives a rank.

Every measurement is repeated --rounds times, alternating the two
frameworks, and reported as the median with the spread (min-max) of the
per-round medians.

  pip install torch safetensors --index-url https://download.pytorch.org/whl/cpu
  python3 bench/torch_compare.py [--build build] [--threads 1,2] [--rounds 3]
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

# The model, its presets and AdamW (beside this file).
from torch_gpt import GPT, PRESETS, adamw


def train_step(model, optimizer, idx, targets):
    optimizer.zero_grad(set_to_none=True)
    loss = model(idx, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


# ---- part 1: GPT-2 124M, one process ---------------------------------------------------------------

def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"torch_compare: {' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def tessera_step_ms(build, threads, steps):
    out = run([f"{build}/bench/train_step", "--threads", str(threads), "--steps", str(steps)])
    median = re.search(r"median of \d+ steps ([\d.]+) ms", out)
    context = re.search(r"^machine: (.*?), \d+ threads used", out, re.M)
    return float(median.group(1)), context.group(1)


def torch_step_ms(model, optimizer, threads, steps, batch, seq_len, vocab):
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(1337)
    idx = torch.randint(vocab, (batch, seq_len), generator=generator)
    targets = torch.randint(vocab, (batch, seq_len), generator=generator)
    train_step(model, optimizer, idx, targets)  # warm-up, as train_step's
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train_step(model, optimizer, idx, targets)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def load_export(model, path):
    from safetensors.torch import load_file
    weights = load_file(path)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        sys.exit(f"torch_compare: {path} does not fit the PyTorch model: missing {missing}, unexpected {unexpected}")


def compare_gpt2(args, rounds_out):
    vocab, block_size, n_layer, n_head, n_embd = PRESETS["gpt2-124m"]
    with tempfile.TemporaryDirectory() as tmp:
        export = os.path.join(tmp, "gpt2.safetensors")
        # The weights of tessera's model after one step, as a safetensors file.
        run([f"{args.build}/examples/gpt/train", "--preset", "gpt2-124m", "--seq-len", "64", "--batch", "4",
             "--steps", "1", "--warmup", "0", "--data", "synthetic", "--eval-every", "0", "--export", export])
        model = GPT(vocab, block_size, n_layer, n_head, n_embd)
        load_export(model, export)
    optimizer = adamw(model, 3e-4)
    for threads in args.threads:
        tessera_rounds, torch_rounds = [], []
        for _ in range(args.rounds):
            ms, context = tessera_step_ms(args.build, threads, args.steps)
            tessera_rounds.append(ms)
            torch_rounds.append(torch_step_ms(model, optimizer, threads, args.steps, 4, 64, vocab))
        rounds_out.append((f"GPT-2 124M step, B=4 T=64, {threads} thread{'s' if threads > 1 else ''}",
                           tessera_rounds, torch_rounds))
    return context


# ---- part 2: the tiny preset on 4 ranks ---------------------------------------------------------------

def fsdp2_worker(rank, world, steps, threads, port, queue):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    vocab, block_size, n_layer, n_head, n_embd = PRESETS["tiny"]
    model = GPT(vocab, block_size, n_layer, n_head, n_embd)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    for module in model.modules():
        # gloo's AVG reduce-scatter is wrong in some versions: sum, then divide.
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    optimizer = adamw(model, 3e-3)
    generator = torch.Generator().manual_seed(rank)
    times = []
    for step in range(steps):
        idx = torch.randint(vocab, (32, 64), generator=generator)
        targets = torch.randint(vocab, (32, 64), generator=generator)
        start = time.perf_counter()
        train_step(model, optimizer, idx, targets)
        times.append((time.perf_counter() - start) * 1e3)
    if rank == 0:
        queue.put(statistics.median(times[steps // 3:]))
    dist.destroy_process_group()


def torch_fsdp2_step_ms(steps, threads):
    import torch.multiprocessing as mp
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    mp.start_processes(fsdp2_worker, args=(4, steps, threads, port, queue), nprocs=4, start_method="spawn")
    return queue.get()


def tessera_fsdp_step_ms(build, steps):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        run([f"{build}/examples/gpt/train", "--nproc", "4", "--steps", str(steps), "--data", "synthetic",
             "--eval-every", "0", "--log-json", log])
        import json
        with open(log) as lines:
            step_ms = [json.loads(line)["step_ms"] for line in lines]
    return statistics.median(step_ms[steps // 3:])


def compare_fsdp(args, rounds_out):
    threads = max(1, (os.cpu_count() or 1) // 4)  # tessera's share per local rank
    tessera_rounds, torch_rounds = [], []
    for _ in range(args.rounds):
        tessera_rounds.append(tessera_fsdp_step_ms(args.build, args.fsdp_steps))
        torch_rounds.append(torch_fsdp2_step_ms(args.fsdp_steps, threads))
    rounds_out.append((f"tiny preset, 4 ranks: tessera FSDP (local) vs FSDP2 (gloo), {threads} thread/rank",
                       tessera_rounds, torch_rounds))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="tessera's build directory")
    parser.add_argument("--threads", default="1,2", help="thread counts for the GPT-2 124M step")
    parser.add_argument("--steps", type=int, default=4, help="timed GPT-2 124M steps per round")
    parser.add_argument("--fsdp-steps", type=int, default=60, help="steps of the 4-rank run (the first third warm up)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating the frameworks")
    parser.add_argument("--skip-fsdp", action="store_true", help="only the GPT-2 124M comparison")
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]

    rows = []
    context = compare_gpt2(args, rows)
    if not args.skip_fsdp:
        compare_fsdp(args, rows)

    print(f"# torch_compare: tessera ({context}) vs PyTorch {torch.__version__} eager "
          f"(oneDNN/MKL as shipped, {torch.backends.cpu.get_cpu_capability()})")
    print(f"# median over {args.rounds} rounds of per-round medians, ms per step; spread = min-max of the rounds")
    print(f"{'case':<78} {'tessera':>16} {'pytorch':>16} {'speed-up':>9}")
    for name, ours, theirs in rows:
        spread = lambda xs: f"{statistics.median(xs):7.1f} ({min(xs):.0f}-{max(xs):.0f})"
        print(f"{name:<78} {spread(ours):>16} {spread(theirs):>16} "
              f"{statistics.median(theirs) / statistics.median(ours):8.2f}x")


if __name__ == "__main__":
    main()
