#!/usr/bin/env python3
"""Installs tessera's public headers under <prefix>/<includedir>/tessera/.

In the source tree headers include each other by layer ("nn/module.h"), which
is what tools/check-layers reads. Installed, every such include is rewritten
to "tessera/nn/module.h", so a user's project needs only -I<includedir> and
none of its own headers can shadow ours. The headers of tensor/cpu/ and
tensor/cuda/ are the implementation and stay behind, and so do the fsdp
headers behind the FSDPModule handle (INTERNAL): users shard with
fsdp/fully_shard.h and never reach FSDPState, FSDPParamGroup or FSDPParam,
whose headers may change without notice. An installed header that includes
a header left behind fails the install.
Run by `meson install` (meson.add_install_script), or by hand:
    tools/install_headers.py SOURCE_ROOT DESTINATION_INCLUDE_DIR
"""
import os
import re
import sys

LAYERS = ("tensor", "autograd", "dist", "nn", "fsdp", "checkpoint")
PRIVATE = ("tensor/cpu/", "tensor/cuda/")
# The machinery behind fsdp::FSDPModule; tests of the internals include them
# from the source tree.
INTERNAL = ("fsdp/state.h", "fsdp/param_group.h", "fsdp/fsdp_param.h")
INCLUDE = re.compile(r'^(\s*#\s*include\s*)"((?:%s)/[^"]+)"' % "|".join(LAYERS), re.MULTILINE)


def public_headers(source_root):
    headers = ["tessera.h"]
    for layer in LAYERS:
        for directory, _, files in os.walk(os.path.join(source_root, layer)):
            for name in files:
                path = os.path.relpath(os.path.join(directory, name), source_root)
                if name.endswith(".h") and not path.startswith(PRIVATE) and path not in INTERNAL:
                    headers.append(path)
    return sorted(headers)


def main():
    if len(sys.argv) == 3:
        source_root, destination = sys.argv[1], sys.argv[2]
    else:
        source_root = os.environ["MESON_SOURCE_ROOT"]
        include_dir = sys.argv[1] if len(sys.argv) > 1 else "include"
        if os.path.isabs(include_dir):  # an absolute includedir inside the prefix
            include_dir = os.path.relpath(include_dir, os.environ["MESON_INSTALL_PREFIX"])
        prefix = os.environ["MESON_INSTALL_DESTDIR_PREFIX"]
        destination = os.path.join(prefix, include_dir)
    headers = public_headers(source_root)
    installed = set(headers)
    problems = []
    for header in headers:
        with open(os.path.join(source_root, header), encoding="utf-8") as file:
            text = file.read()
        for match in INCLUDE.finditer(text):
            if match.group(2) not in installed:
                problems.append(f"{header} includes {match.group(2)}, which is not a public header")
        text = INCLUDE.sub(lambda m: f'{m.group(1)}"tessera/{m.group(2)}"', text)
        target = os.path.join(destination, "tessera", header)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as file:
            file.write(text)
    if problems:
        sys.exit("install_headers: " + "\n".join(problems))
    print(f"install_headers: {len(headers)} headers in {os.path.join(destination, 'tessera')}")


if __name__ == "__main__":
    main()
