#!/usr/bin/env python3
"""The MEASURED time of each kernel in the last training step of an ncu
profile, grouped by the names the simulator counts under, as JSON for
`gpt2_step_prediction --measured FILE` (tools/gpu_check.sh writes the profile:
`ncu --metrics gpu__time_duration.sum --csv` over `train --steps S`).

A kernel's name is its function's: tessera's kernels lose their namespace and
template arguments ("void tessera::<unnamed>::reduce_kernel<...>(...)" is
"reduce_kernel"); every other kernel in a tessera step is cuBLASLt's (cutlass,
nvjet, its split-K reductions) and counts as "cublasLtMatmul", the one call the
simulator's twin stands for. The step is the launches after the optimizer's
last kernel of the next-to-last step, to the optimizer's last kernel of the
last one: a whole step (cyclically), whatever the start-up launched before
the first (the init's kernels, which a plain last 1/S would take in part).
The optimizer's kernel (AdamW's) launches the same number of times each step;
the script checks that, and that the last two steps launched the same kernels.

  python3 bench/ncu_kernel_times.py PROFILE.csv --steps 2 --batch 16 --seq-len 1024 \\
      --gpu "NVIDIA H100 80GB HBM3" --commit 859aa70 --out bench/data/h100_gpt2_kernels.json
"""
import argparse
import collections
import csv
import datetime
import json
import os
import re
import sys


def base_name(kernel):
    """'void tessera::<unnamed>::copy_kernel<float, ...>(...)' -> 'copy_kernel'; other libraries' -> cublasLtMatmul."""
    if "tessera::" not in kernel:
        return "cublasLtMatmul"
    name = kernel.split("tessera::")[-1] if "<unnamed>::" not in kernel else kernel.split("<unnamed>::", 1)[1]
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()


# The kernel each optimizer step ends with (tensor/cuda/optimizer.cu).
OPTIMIZER_KERNEL = "adamw_kernel"


def read_profile(path):
    """[(launch id, kernel name, nanoseconds)] in launch order."""
    with open(path, newline="") as file:
        rows = [row for row in csv.reader(file) if len(row) > 10]
    if not rows or "Kernel Name" not in rows[0]:
        sys.exit(f"ncu_kernel_times: {path} has no ncu CSV header (ID, Kernel Name, Metric Value, ...)")
    header = rows[0]
    column = {name: header.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    launches = []
    for row in rows[1:]:
        if row[column["Metric Name"]] != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(row[column["Metric Unit"]])
        if scale is None:
            sys.exit(f"ncu_kernel_times: unknown unit {row[column['Metric Unit']]!r} in {path}")
        value = float(row[column["Metric Value"]].replace(",", "")) * scale
        launches.append((int(row[column["ID"]]), row[column["Kernel Name"]], value))
    launches.sort()
    return launches


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("--steps", type=int, required=True, help="training steps the profile covers")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--commit", required=True, help="the commit that was profiled")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if os.path.exists(args.out) and os.path.samefile(args.out, args.profile):
        sys.exit(f"ncu_kernel_times: --out {args.out} is the profile it reads: writing it would destroy the input")

    launches = read_profile(args.profile)
    if args.steps < 2:
        sys.exit("ncu_kernel_times: --steps must be at least 2 (a step ends where the one before it ended)")
    optimizer = [index for index, (_, kernel, _) in enumerate(launches) if base_name(kernel) == OPTIMIZER_KERNEL]
    if not optimizer or len(optimizer) % args.steps:
        sys.exit(f"ncu_kernel_times: {len(optimizer)} launches of {OPTIMIZER_KERNEL} do not split into "
                 f"{args.steps} steps")
    per_step = len(optimizer) // args.steps
    last = launches[optimizer[-per_step - 1] + 1:optimizer[-1] + 1]
    if args.steps > 2:
        before = launches[optimizer[-2 * per_step - 1] + 1:optimizer[-per_step - 1] + 1]
        if [base_name(k) for _, k, _ in before] != [base_name(k) for _, k, _ in last]:
            print("ncu_kernel_times: warning: the last two steps launched different kernels", file=sys.stderr)
    per_step = len(last)
    kernels = collections.OrderedDict()
    for _, kernel, nanoseconds in sorted(last, key=lambda launch: -launch[2]):
        entry = kernels.setdefault(base_name(kernel), {"ms": 0.0, "launches": 0})
        entry["ms"] += nanoseconds / 1e6
        entry["launches"] += 1
    total = sum(entry["ms"] for entry in kernels.values())
    result = {
        "gpu": args.gpu,
        "date": args.date,
        "source": f"MEASURED by ncu --metrics gpu__time_duration.sum --clock-control none (tools/gpu_check.sh) "
                  f"on {args.gpu}, {args.date}, commit {args.commit}: the last of {args.steps} steps of "
                  f"train --preset gpt2-124m --param-dtype bf16 --batch {args.batch} --seq-len {args.seq_len}",
        "batch": args.batch,
        "seq_len": args.seq_len,
        "total_ms": total,
        "kernels": {name: {"ms": round(entry["ms"], 4), "launches": entry["launches"]}
                    for name, entry in sorted(kernels.items(), key=lambda item: -item[1]["ms"])},
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    print(f"ncu_kernel_times: {per_step} launches, {total:.2f} ms of kernels in the last step -> {args.out}")


if __name__ == "__main__":
    main()
