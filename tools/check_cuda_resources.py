#!/usr/bin/env python3
"""Checks the resources of every cuda kernel in an nvidia build (meson
-Dgpu_runtime=nvidia): no register spills and no local memory on any target
architecture, at most 255 registers a thread, and registers x the kernel's
__launch_bounds__ threads within a multiprocessor's 64 Ki registers, so that
every block the kernel may be launched with fits.

Given the output of the ninja run that built the objects, from a build
configured with -Dgpu_resource_report=true (tools/test.sh saves it), each
.cu file that run compiled is checked without compiling it again: ptxas's
report per kernel and architecture from the log, and the .maxntid each
__launch_bounds__ leaves from each architecture's cubin in the object
(the .nv.info of the fatbin nvcc embeds). The kernels of the two must be the
same. Every other .cu file in the build's compile_commands.json (or all of
them, without a log) is compiled twice more: with --resource-usage, and with
-ptx for compute_90 for the .maxntid, as many files at once as the machine
has cores. Prints one line per kernel and architecture checked, in the
build's order; exits 1 on any violation.

    python3 tools/check_cuda_resources.py build-nvidia [ninja-output.log]
"""
import json
import os
import re
import shlex
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REGISTERS_PER_MULTIPROCESSOR = 65536
MAX_REGISTERS_PER_THREAD = 255

# nvcc's fatbin, undocumented: a header, then images, each behind its own
# header (kind at byte 0: 1 PTX, 2 cubin; header size at 4, image size at 8,
# SM version at 28). A cubin's kernels are its symbols marked as entries;
# each one's .nv.info records (format, attribute, 16-bit value or payload
# size) hold the .maxntid as three 32-bit numbers. A misread shows as
# kernels that differ from ptxas's report, which is an error.
FATBIN_MAGIC = 0xBA55ED50
FATBIN_CUBIN = 2
SHT_SYMTAB = 2
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10
EIFMT_SVAL = 4
EIATTR_MAX_THREADS = 0x05


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


def parse_resource_usage(report):
    """{(kernel, arch): {"registers", "stack", "spill_stores", "spill_loads"}} from ptxas's report."""
    usage, current = {}, None
    for line in report.splitlines():
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


def resource_usage(arguments, directory):
    """ptxas's report for one compile, compiled again with --resource-usage."""
    result = subprocess.run(without_output(arguments) + ["--resource-usage", "-c", "-o", "/dev/null"],
                            cwd=directory, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"check_cuda_resources: the compile failed:\n{result.stderr}")
    return parse_resource_usage(result.stderr)


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


def reports_in_log(log, objects):
    """{object: the output of its compile} for each of objects that ninja compiled in log: the lines after
    the status line ("[3/196] Compiling Cuda object <object>") up to the next one."""
    reports, current = {}, None
    for line in log.splitlines():
        if re.match(r"\[\d+/\d+\] ", line):
            current = next((word for word in line.split() if word in objects), None)
            if current:
                reports[current] = []
        elif current:
            reports[current].append(line)
    return {name: "\n".join(lines) for name, lines in reports.items()}


def elf_sections(image):
    """[(name, type, offset, size, link)] of a little-endian 64-bit ELF image."""
    table, = struct.unpack_from("<Q", image, 0x28)
    entry_size, count, names = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQI", image, table + i * entry_size) for i in range(count)]
    names_at = headers[names][4]
    return [(c_string(image, names_at + name), kind, offset, size, link)
            for name, kind, _, _, offset, size, link in headers]


def c_string(image, at):
    """The NUL-terminated name at offset at."""
    return image[at:image.index(b"\0", at)].decode()


def cubins(path):
    """[(arch, cubin)] of the fatbin that nvcc embeds in a host object (its .nv_fatbin section)."""
    data = path.read_bytes()
    section = next((s for s in elf_sections(data) if s[0] == ".nv_fatbin"), None)
    if section is None:
        sys.exit(f"check_cuda_resources: {path} has no .nv_fatbin section")
    fatbin = data[section[2]:section[2] + section[3]]
    magic, _, header_size, size = struct.unpack_from("<IHHQ", fatbin, 0)
    if magic != FATBIN_MAGIC:
        sys.exit(f"check_cuda_resources: {path}: .nv_fatbin starts with {magic:#x}, not a fatbin's {FATBIN_MAGIC:#x}")
    images, at = [], header_size
    while at < header_size + size:
        kind, _, image_header_size, image_size = struct.unpack_from("<HHIQ", fatbin, at)
        arch, = struct.unpack_from("<I", fatbin, at + 28)
        image = fatbin[at + image_header_size:at + image_header_size + image_size]
        if kind == FATBIN_CUBIN:
            if image[:4] != b"\x7fELF":
                sys.exit(f"check_cuda_resources: {path}: the sm_{arch} cubin is compressed (fatbinary -compress-all?)")
            images.append((f"sm_{arch}", image))
        at += image_header_size + image_size
    return images


def max_threads(records):
    """The .maxntid's threads from a kernel's .nv.info records; None without __launch_bounds__."""
    at = 0
    while at + 4 <= len(records):
        record_format, attribute, value = struct.unpack_from("<BBH", records, at)
        if attribute == EIATTR_MAX_THREADS and record_format == EIFMT_SVAL and value == 12:
            x, y, z = struct.unpack_from("<III", records, at + 4)
            return x * y * z
        at += 4 + (value if record_format == EIFMT_SVAL else 0)
    return None


def cubin_launch_bounds(image):
    """{kernel: max threads per block or None} for each entry function of a cubin."""
    sections = elf_sections(image)
    _, _, symbols_at, symbols_size, strings = next(s for s in sections if s[1] == SHT_SYMTAB)
    strings_at = sections[strings][2]
    bounds = {}
    for at in range(symbols_at, symbols_at + symbols_size, 24):
        name, info, other = struct.unpack_from("<IBB", image, at)
        if info & 0xF == STT_FUNC and other & STO_CUDA_ENTRY:
            bounds[c_string(image, strings_at + name)] = None
    for name, _, offset, size, _ in sections:
        kernel = name.removeprefix(".nv.info.")
        if kernel != name and kernel in bounds:
            bounds[kernel] = max_threads(image[offset:offset + size])
    return bounds


def object_launch_bounds(path, usage):
    """{(kernel, arch): max threads per block} from the object's cubins, whose kernels must be usage's."""
    bounds = {}
    for arch, image in cubins(path):
        bounds.update({(kernel, arch): threads for kernel, threads in cubin_launch_bounds(image).items()})
    if bounds and not usage:
        sys.exit(f"check_cuda_resources: the log has no ptxas report for {path} (built without "
                 f"-Dgpu_resource_report=true?)")
    if bounds.keys() != usage.keys():
        unreported = sorted(f"{kernel} on {arch}" for kernel, arch in bounds.keys() - usage.keys())
        unbuilt = sorted(f"{kernel} on {arch}" for kernel, arch in usage.keys() - bounds.keys())
        sys.exit(f"check_cuda_resources: {path}: the log's ptxas report and the object's cubins hold different "
                 f"kernels: {len(unreported)} not in the report {unreported[:3]}, {len(unbuilt)} not in the object "
                 f"{unbuilt[:3]}")
    return bounds


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    build = Path(sys.argv[1])
    commands = [c for c in json.loads((build / "compile_commands.json").read_text()) if c["file"].endswith(".cu")]
    if not commands:
        sys.exit(f"check_cuda_resources: no .cu files in {build}/compile_commands.json (an nvidia build?)")
    objects = {c["output"] for c in commands}
    reports = reports_in_log(Path(sys.argv[2]).read_text(), objects) if len(sys.argv) == 3 else {}
    if len(sys.argv) == 3 and len(reports) < len(objects):
        print(f"check_cuda_resources: {len(objects) - len(reports)} of {len(objects)} .cu files not compiled in "
              f"{sys.argv[2]}: compiling them again", file=sys.stderr)

    def measure(command):
        if command["output"] in reports:
            usage = parse_resource_usage(reports[command["output"]])
            return usage, object_launch_bounds(Path(command["directory"]) / command["output"], usage)
        arguments = shlex.split(command["command"])
        usage = resource_usage(arguments, command["directory"])
        bounds = launch_bounds(arguments, command["directory"])
        return usage, {(kernel, arch): bounds.get(kernel) for kernel, arch in usage}

    # The compiles run as child processes: threads are enough to keep every core busy.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        measured = list(pool.map(measure, commands))
    failures, checked = [], 0
    for command, (usage, bounds) in zip(commands, measured):
        for (kernel, arch), resources in sorted(usage.items()):
            checked += 1
            threads = bounds[(kernel, arch)]
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
