#!/usr/bin/env python3
"""Writes the C++ unit through which g++ compiles a kernel source (.cu) for
the SIMT simulator: the source itself, under a #line naming it, with one
rewrite. CUDA's `extern __shared__ T name[];` (the block's dynamic shared
memory) has no C++ spelling, so each such declaration inside a function
becomes `T* const name = dynamic_shared_memory<T>();` on the same line. A
declaration at namespace scope is refused: declare it inside the kernel.

usage: make_kernel_unit.py SOURCE OUTPUT SOURCE_ROOT
"""
import os
import re
import sys

DECLARATION = re.compile(
    r"extern\s+__shared__\s+"
    r"((?:(?:__align__|alignas)\s*\(\s*\w+\s*\)\s*)*)"  # alignment, dropped: the window is 16-byte aligned
    r"([A-Za-z_][\w:<>,\s]*?)\s*"  # the element type
    r"\b([A-Za-z_]\w*)\s*\[\s*\]\s*;")


def brace_scopes(text):
    """For each offset, whether it lies inside a function body (a brace not
    opened by `namespace` or `extern "C"`), skipping comments and strings."""
    inside_code = [False] * (len(text) + 1)
    stack = []
    statement_start = 0
    index = 0
    while index < len(text):
        char = text[index]
        if text.startswith("//", index):
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
            continue
        if text.startswith("/*", index):
            end = text.find("*/", index + 2)
            index = len(text) if end < 0 else end + 2
            continue
        if char in "\"'":
            end = index + 1
            while end < len(text) and text[end] != char:
                end += 2 if text[end] == "\\" else 1
            index = end + 1
            continue
        if char == "{":
            head = text[statement_start:index]
            stack.append(not re.search(r"\bnamespace\b|\bextern\s+\"C", head))
            statement_start = index + 1
        elif char == "}":
            if stack:
                stack.pop()
            statement_start = index + 1
        elif char == ";":
            statement_start = index + 1
        inside_code[index] = any(stack)
        index += 1
    return inside_code


def rewrite(text, source_name):
    scopes = brace_scopes(text)

    def replace(match):
        element = " ".join(match.group(2).split())
        name = match.group(3)
        line = text.count("\n", 0, match.start()) + 1
        if not scopes[match.start()]:
            sys.exit(f"{source_name}:{line}: extern __shared__ {name} at namespace scope: the simulator needs it "
                     "declared inside the kernel that uses it")
        newlines = "\n" * match.group(0).count("\n")  # keep every later line where it was
        return f"{element}* const {name} = dynamic_shared_memory<{element}>();{newlines}"

    return DECLARATION.sub(replace, text)


def main():
    source, output, root = sys.argv[1:4]
    name = os.path.relpath(os.path.abspath(source), os.path.abspath(root))
    with open(source, encoding="utf-8") as file:
        text = file.read()
    unit = f"// Generated from {name} for the SIMT simulator (tensor/cuda/sim/make_kernel_unit.py).\n"
    unit += f'#line 1 "{name}"\n' + rewrite(text, name)
    if os.path.exists(output):
        with open(output, encoding="utf-8") as file:
            if file.read() == unit:
                return
    with open(output, "w", encoding="utf-8") as file:
        file.write(unit)


if __name__ == "__main__":
    main()
