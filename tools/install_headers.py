#!/usr/bin/env python3
"""Installs tessera's public headers under <prefix>/<includedir>/tessera/.

Public means what a model author or a backend writer includes (ENTRY_POINTS)
and every header those include, and nothing else: the backends other than
local threads, the launch machinery (store, sockets, lifelines), the kernels
of tensor/cpu/ and tensor/cuda/ and the fsdp machinery behind the
FSDPModule handle stay behind, free to change without notice. An installed
header that names a build option (TESSERA_HAVE_*) fails the install: the
installed tree is the same for every build of one version, so a user's
program needs no definitions of ours.

In the source tree headers include each other by layer ("nn/module.h"),
which is what the layer test reads. Installed, every such include is
rewritten to "tessera/nn/module.h", so a user's project needs only
-I<includedir> and none of its own headers can shadow ours.
Run by `meson install` (meson.add_install_script), or by hand:
    tools/install_headers.py SOURCE_ROOT DESTINATION_INCLUDE_DIR
    tools/install_headers.py --list SOURCE_ROOT
"""
import os
import re
import sys

LAYERS = ("tensor", "autograd", "dist", "nn", "tp", "fsdp", "checkpoint")
# What a user includes by name; everything they include comes along.
ENTRY_POINTS = (
    "tessera.h",  # a model author's one include: tensors to sharded checkpoints
    "autograd/function.h",  # custom differentiable functions
    "autograd/gradcheck.h",  # finite-difference checks of them
    "tensor/parallel.h",  # intra-op threads
    "dist/reduction.h",  # a backend writer's reduction kernel (the contract of ReduceOp)
    "checkpoint/async_save.h",
    "checkpoint/safetensors.h",
    "checkpoint/safetensors_export.h",
)
# Never installed, even when something public would include them: a public
# header that does fails the install.
PRIVATE = ("tensor/cpu/", "tensor/cuda/", "dist/backends/", "dist/launch/", "fsdp/state.h", "fsdp/param_group.h",
           "fsdp/fsdp_param.h", "fsdp/streams.h")
# dist/backends/local_backend.h is public all the same: run_local starts a model's ranks as threads.
PUBLIC_EXCEPTIONS = ("dist/backends/local_backend.h",)
INCLUDE = re.compile(r'^(\s*#\s*include\s*)"((?:%s)/[^"]+)"' % "|".join(LAYERS), re.MULTILINE)
BUILD_OPTION = re.compile(r"\bTESSERA_HAVE_[A-Z_]+")


def is_private(header):
    return header.startswith(PRIVATE) and header not in PUBLIC_EXCEPTIONS


def public_headers(source_root):
    """The entry points and everything they include, with the problems found on the way."""
    headers, problems = set(), []
    pending = list(ENTRY_POINTS)
    while pending:
        header = pending.pop()
        if header in headers:
            continue
        headers.add(header)
        with open(os.path.join(source_root, header), encoding="utf-8") as file:
            text = file.read()
        if BUILD_OPTION.search(text):
            problems.append(f"{header} depends on a build option ({BUILD_OPTION.search(text).group(0)})")
        for match in INCLUDE.finditer(text):
            included = match.group(2)
            if is_private(included):
                problems.append(f"{header} includes {included}, which is not a public header")
            elif included not in headers:
                pending.append(included)
    return sorted(headers), problems


def install(source_root, destination):
    headers, problems = public_headers(source_root)
    if problems:
        sys.exit("install_headers: " + "\n".join(problems))
    for header in headers:
        with open(os.path.join(source_root, header), encoding="utf-8") as file:
            text = INCLUDE.sub(lambda m: f'{m.group(1)}"tessera/{m.group(2)}"', file.read())
        target = os.path.join(destination, "tessera", header)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as file:
            file.write(text)
    print(f"install_headers: {len(headers)} headers in {os.path.join(destination, 'tessera')}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--list":
        headers, problems = public_headers(sys.argv[2])
        print("\n".join(headers + [f"problem: {p}" for p in problems]))
        sys.exit(1 if problems else 0)
    if len(sys.argv) == 3:
        return install(sys.argv[1], sys.argv[2])
    source_root = os.environ["MESON_SOURCE_ROOT"]
    include_dir = sys.argv[1] if len(sys.argv) > 1 else "include"
    if os.path.isabs(include_dir):  # an absolute includedir inside the prefix
        include_dir = os.path.relpath(include_dir, os.environ["MESON_INSTALL_PREFIX"])
    install(source_root, os.path.join(os.environ["MESON_INSTALL_DESTDIR_PREFIX"], include_dir))


if __name__ == "__main__":
    main()
