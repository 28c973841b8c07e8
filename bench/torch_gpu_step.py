#!/usr/bin/env python3
"""PyTorch beside tessera on one GPU (run by tools/gpu_check.sh; needs torch).

1. GPT-2 124M training steps at tessera's shapes and recipe (bench/torch_gpt.py:
   the tied head, AdamW betas 0.9/0.95 with decay on matrices, clipping at 1),
   bf16 autocast over f32 master weights (what `train --param-dtype bf16`
   does: bf16 compute, f32 parameters, gradients and AdamW state), fused
   AdamW, flash attention through scaled_dot_product_attention: eager, then
   torch.compile. Median step time over --steps after --warmup-steps.
2. The figures the step prediction is calibrated with
   (bench/gpu_roofline.h reads the JSON): bf16 GEMMs at every GPT-2 linear's
   forward and backward shapes (cuBLAS, f32 accumulation) and the
   device-to-device copy rate, each the median of timed repeats with CUDA
   events.

  python3 bench/torch_gpu_step.py --device cuda --out torch.json --calibration calibration.json
  python3 bench/torch_gpu_step.py --device cpu --n-layer 1 --batch 1 --seq-len 64 --steps 2   # a dry run
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, GPT2_PADDED_VOCAB, PRESETS, adamw  # noqa: E402


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_times(model, optimizer, batches, device, steps, warmup_steps):
    """Milliseconds per training step (forward, backward, clipping, AdamW), synchronised each step."""
    times = []
    for step in range(warmup_steps + steps):
        idx, targets = batches[step % len(batches)]
        synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        synchronize(device)
        if step >= warmup_steps:
            times.append((time.perf_counter() - start) * 1e3)
    return times, loss.item()


def gpt2_steps(args, device, compiled):
    vocab, block_size, n_layer, n_head, n_embd = PRESETS["gpt2-124m"]
    n_layer = args.n_layer or n_layer
    torch.manual_seed(1337)
    # The table padded to 50304 rows, as tessera's gpt2 presets and nanoGPT pad it; the tokens stay below 50257.
    model = GPT(GPT2_PADDED_VOCAB, max(block_size, args.seq_len), n_layer, n_head, n_embd)
    for name, parameter in model.named_parameters():  # GPT-2's initialisation, as tessera's
        if parameter.dim() >= 2:
            torch.nn.init.normal_(parameter, 0.0, 0.02)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(parameter)
    model = model.to(device)
    optimizer = adamw(model, 6e-4, **({"fused": True} if device.type == "cuda" else {}))
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, vocab, (args.batch, args.seq_len + 1), generator=generator).to(device)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    start = time.perf_counter()
    runner = torch.compile(model) if compiled else model
    times, loss = step_times(runner, optimizer, batches, device, args.steps, args.warmup_steps)
    first_steps_s = time.perf_counter() - start - sum(times) / 1e3
    median = statistics.median(times)
    tokens = args.batch * args.seq_len
    return {
        "mode": "torch.compile" if compiled else "eager",
        "n_layer": n_layer, "batch": args.batch, "seq_len": args.seq_len,
        "step_ms_median": median, "step_ms_min": min(times), "step_ms_max": max(times),
        "tokens_per_s": tokens / (median / 1e3), "warmup_s": first_steps_s, "final_loss": loss,
    }


def timed_ms(device, function, repeats):
    """Median milliseconds of `function` over `repeats` calls, timed with CUDA events (host clock on cpu)."""
    for _ in range(3):
        function()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            function()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            start = time.perf_counter()
            function()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def gpt2_gemm_shapes(rows):
    """(m, n, k) of every GPT-2 124M linear at `rows` = B T tokens: forward Y = X W^T, and backward's
    dX = dY W and dW = dY^T X (the latter with k = rows)."""
    shapes = set()
    for inputs, outputs in ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, GPT2_PADDED_VOCAB)):
        shapes.add((rows, outputs, inputs))    # forward
        shapes.add((rows, inputs, outputs))    # input gradient
        shapes.add((outputs, inputs, rows))    # weight gradient
    return sorted(shapes)


def calibration(args, device):
    # The shapes of B, 2B and 4B (16, 32 and 64 by default): the prediction covers those three batches, and a
    # shape it has no figure for takes the lowest efficiency among smaller measured ones (pessimistic).
    shapes = sorted({shape for factor in (1, 2, 4) for shape in gpt2_gemm_shapes(factor * args.batch * args.seq_len)})
    gemms = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        ms = timed_ms(device, lambda: torch.matmul(a, b), args.repeats)
        gemms.append({"m": m, "n": n, "k": k, "ms": ms, "tflops": 2.0 * m * n * k / (ms / 1e3) / 1e12})
        del a, b
    copy_bytes = 1 << 30 if device.type == "cuda" else 1 << 26
    source = torch.empty(copy_bytes // 4, device=device, dtype=torch.float32)
    target = torch.empty_like(source)
    copy_ms = timed_ms(device, lambda: target.copy_(source), args.repeats)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)"
    return {
        "gpu": name,
        "date": datetime.date.today().isoformat(),
        "source": f"measured on {name} by bench/torch_gpu_step.py (tools/gpu_check.sh), torch {torch.__version__}: "
                  f"median of {args.repeats} CUDA-event-timed repeats after 3 warm-ups, random bf16 operands",
        "hbm_bytes_per_second": 2.0 * copy_bytes / (copy_ms / 1e3),  # a copy reads and writes every byte
        "gemm": gemms,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--n-layer", type=int, default=0, help="layers (0: GPT-2 124M's 12)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats of each calibration kernel")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    parser.add_argument("--out", help="write the step figures to this JSON file")
    parser.add_argument("--calibration", help="write the GEMM and copy figures to this JSON file")
    args = parser.parse_args()
    if args.out and args.calibration and os.path.abspath(args.out) == os.path.abspath(args.calibration):
        sys.exit("torch_gpu_step: --out and --calibration name the same file")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpu_step: torch sees no GPU (use --device cpu for a dry run)")
    torch.backends.cuda.matmul.allow_tf32 = False  # tessera's f32 GEMMs are f32's
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}",
          flush=True)

    results = {"torch": torch.__version__, "runs": []}
    for compiled in (False, True):
        if compiled and args.no_compile:
            continue
        run = gpt2_steps(args, device, compiled)
        results["runs"].append(run)
        print(f"torch {run['mode']:>13}: {run['step_ms_median']:8.2f} ms/step (min {run['step_ms_min']:.2f}, "
              f"max {run['step_ms_max']:.2f}), {run['tokens_per_s'] / 1e3:7.1f} k tokens/s, "
              f"{run['warmup_s']:.1f} s before the timed steps, loss {run['final_loss']:.4f}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as out:
            json.dump(results, out, indent=1)
    if args.calibration:
        figures = calibration(args, device)
        with open(args.calibration, "w") as out:
            json.dump(figures, out, indent=1)
        print(f"calibration: copy {figures['hbm_bytes_per_second'] / 1e12:.2f} TB/s (read + write)", flush=True)
        for gemm in figures["gemm"]:
            print(f"calibration: bf16 GEMM m {gemm['m']:6d} n {gemm['n']:6d} k {gemm['k']:6d}: "
                  f"{gemm['ms']:7.3f} ms, {gemm['tflops']:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
