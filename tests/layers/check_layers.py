#!/usr/bin/env python3
"""The layer order of ARCHITECTURE.md, checked on every include.

    tensor < autograd < dist < nn < {tp, fsdp, checkpoint} < train < {examples, bench, tests}

A file includes only from its own layer or lower ones; tp, fsdp and
checkpoint are siblings and include none of each other. Reads every C++ and
CUDA source under the layers' folders of ROOT and prints each include that
breaks the order as FILE:LINE: what it includes. Exits 1 when it printed any.
    check_layers.py ROOT          check a tree (the source root)
    check_layers.py --self-test   plant bad includes in a scratch tree and check they are caught
"""
import os
import re
import sys
import tempfile

RANK = {"tensor": 0, "autograd": 1, "dist": 2, "nn": 3, "tp": 4, "fsdp": 4, "checkpoint": 4, "train": 5,
        "examples": 6, "bench": 6, "tests": 6}
SIBLING_RANK = 4
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?:tessera/)?([A-Za-z_]+)/')


def breaks(layer, target):
    mine, theirs = RANK[layer], RANK.get(target)
    if theirs is None:
        return False
    return theirs > mine or (theirs == mine == SIBLING_RANK and target != layer)


def violations(root):
    found = []
    for layer in RANK:
        if RANK[layer] == RANK["tests"] or not os.path.isdir(os.path.join(root, layer)):
            continue
        for directory, _, files in os.walk(os.path.join(root, layer)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8", errors="replace") as file:
                    for number, line in enumerate(file, 1):
                        match = INCLUDE.match(line)
                        if match and breaks(layer, match.group(1)):
                            found.append(f"{os.path.relpath(path, root)}:{number}: {layer} includes "
                                         f"{match.group(1)}/ ({line.strip()})")
    return found


def self_test():
    """Each planted include must be named, and only those."""
    planted = {
        "tensor/ops/upward.cpp": '#include "nn/module.h"',  # a layer above
        "autograd/engine_upward.h": "#include <tessera/fsdp/fsdp.h>",  # the installed spelling
        "fsdp/sibling.cpp": '#include "checkpoint/state_dict.h"',  # a sibling
        "checkpoint/into_train.h": '#include "train/trainer.h"',
    }
    allowed = {
        "nn/fine.cpp": '#include "dist/process_group.h"',
        "train/fine.cpp": '#include "fsdp/fully_shard.h"',
        "bench/fine.cpp": '#include "train/trainer.h"',
        "tensor/system.cpp": "#include <vector>",
    }
    with tempfile.TemporaryDirectory() as root:
        for path, line in {**planted, **allowed}.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as file:
                file.write(f"// a file\n{line}\n")
        found = violations(root)
    named = sorted(entry.split(":")[0] for entry in found)
    if named != sorted(planted) or any(":2: " not in entry for entry in found):
        print("check_layers self-test: expected exactly", sorted(planted), "at line 2, got:", *found, sep="\n  ")
        return 1
    print(f"check_layers self-test: all {len(planted)} planted includes named, {len(allowed)} allowed ones not")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    found = violations(sys.argv[1])
    print("\n".join(found) if found else "check_layers: every include keeps the layer order")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
