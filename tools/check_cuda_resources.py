#!/usr/bin/env python3
"""Checks the resources of every cuda kernel in an nvidia build (meson
-Dgpu_runtime=nvidia): no register spills and no local memory on any target
architecture, at most 255 registers a thread, and registers x the kernel's
__launch_bounds__ threads within a multiprocessor's 64 Ki registers, so that
every block the kernel may be launched with fits.

It reruns each .cu compile from the build's compile_commands.json twice:
with --resource-usage (ptxas's report per kernel and architecture) and with
-ptx for compute_90 (the .maxntid each __launch_bounds__ leaves), as many
files at once as the machine has cores. Prints one line per kernel and
architecture checked, in the build's order; exits 1 on any violation.

    python3 tools/check_cuda_resources.py build-nvidia
"""
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REGISTERS_PER_MULTIPROCESSOR = 65536
MAX_REGISTERS_PER_THREAD = 255


def without_output(arguments):
    """The compile command without its -o/-c parts and dependency-file flags."""
    kept, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
            continue
        if argument in ("-o", "-MF", "-MT", "-MQ", "-odir"):
            skip = True
            continue
        if argument in ("-c", "-MD", "-MMD") or argument.startswith("--generate-dependencies"):
            continue
        kept.append(argument)
    return kept


def resource_usage(arguments, directory):
    """{(kernel, arch): {"registers", "stack", "spill_stores", "spill_loads"}} from ptxas."""
    result = subprocess.run(without_output(arguments) + ["--resource-usage", "-c", "-o", "/dev/null"],
                            cwd=directory, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"check_cuda_resources: the compile failed:\n{result.stderr}")
    usage, current = {}, None
    for line in result.stderr.splitlines():
        entry = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
        if entry:
            current = entry.groups()
            usage[current] = {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0}
            continue
        if current is None:
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if frame:
            usage[current].update(stack=int(frame[1]), spill_stores=int(frame[2]), spill_loads=int(frame[3]))
        registers = re.search(r"Used (\d+) registers", line)
        if registers:
            usage[current]["registers"] = int(registers[1])
    return usage


def launch_bounds(arguments, directory):
    """{kernel: max threads per block} from the .maxntid of the compute_90 PTX."""
    plain = [a for a in without_output(arguments) if not a.startswith("arch=")]
    plain = [a for i, a in enumerate(plain) if not (a == "-gencode")]
    result = subprocess.run(plain + ["-arch=compute_90", "-ptx", "-o", "-"], cwd=directory, capture_output=True,
                            text=True)
    if result.returncode != 0:
        sys.exit(f"check_cuda_resources: the PTX compile failed:\n{result.stderr}")
    bounds, kernel = {}, None
    for line in result.stdout.splitlines():
        entry = re.match(r"\.visible \.entry (\S+?)\(", line) or re.match(r"\.entry (\S+?)\(", line)
        if entry:
            kernel = entry[1]
        ntid = re.match(r"\s*\.maxntid (\d+), (\d+), (\d+)", line)
        if ntid and kernel:
            bounds[kernel] = int(ntid[1]) * int(ntid[2]) * int(ntid[3])
    return bounds


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = Path(sys.argv[1])
    commands = [c for c in json.loads((build / "compile_commands.json").read_text()) if c["file"].endswith(".cu")]
    if not commands:
        sys.exit(f"check_cuda_resources: no .cu files in {build}/compile_commands.json (an nvidia build?)")
    def measure(command):
        arguments = shlex.split(command["command"])
        return resource_usage(arguments, command["directory"]), launch_bounds(arguments, command["directory"])

    # The compiles run as child processes: threads are enough to keep every core busy.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        measured = list(pool.map(measure, commands))
    failures, checked = [], 0
    for command, (usage, bounds) in zip(commands, measured):
        for (kernel, arch), resources in sorted(usage.items()):
            checked += 1
            threads = bounds.get(kernel)
            problems = []
            if resources["spill_stores"] or resources["spill_loads"]:
                problems.append(f"spills {resources['spill_stores']} B stored, {resources['spill_loads']} B loaded")
            if resources["stack"]:
                problems.append(f"{resources['stack']} B of local memory (stack frame)")
            if resources["registers"] > MAX_REGISTERS_PER_THREAD:
                problems.append(f"{resources['registers']} registers a thread")
            if threads is None:
                problems.append("no __launch_bounds__")
            elif resources["registers"] * threads > REGISTERS_PER_MULTIPROCESSOR:
                problems.append(f"{resources['registers']} registers x {threads} threads exceeds "
                                f"{REGISTERS_PER_MULTIPROCESSOR}")
            status = "; ".join(problems) if problems else "ok"
            print(f"{arch:7} {resources['registers']:3} regs  {threads or 0:5} threads  {kernel[:100]}: {status}")
            if problems:
                failures.append(f"{Path(command['file']).name}: {kernel} on {arch}: {status}")
    print(f"check_cuda_resources: {checked} kernel builds checked, {len(failures)} problems")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
