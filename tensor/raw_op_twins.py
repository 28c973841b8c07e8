#!/usr/bin/env python3
"""Writes the header that lists the raw ops (tensor/ops.h) whose
differentiable twin (autograd/functions.h) has the same name, read from the
two headers' declarations at build time: the raw-op guard names the twin in
its refusal (tensor/raw_op_guard.cpp), and a list kept by hand drifted from
the declarations it restated.

Every line at column 0 inside the headers' namespaces must be a form this
script knows, so a declaration written in a new way stops the build instead
of going unread.

usage: raw_op_twins.py OPS_HEADER FUNCTIONS_HEADER OUTPUT
"""
import re
import sys

# A function declared at namespace scope: a return type (std::pair<Tensor,
# Tensor> included), then its name and the opening parenthesis.
DECLARATION = re.compile(r"^(?:[\w:]+(?:<[^()]*>)?[&*]?\s+)+(\w+)\(")
# Lines at namespace scope that declare no function of their own name.
OTHER = re.compile(
    r"^(?:$|//|#|namespace |}|struct \w+ \{|using |enum class |inline constexpr |"
    r"[\w:]+[&*]? operator\W+\()")


def declared_functions(path, namespace):
    """Names of the functions declared in `namespace` of the header at `path`."""
    names = []
    inside = False
    with open(path, encoding="utf-8") as header:
        for number, line in enumerate(header, start=1):
            line = line.rstrip("\n")
            if line == f"namespace {namespace} {{":
                inside = True
                continue
            if line == f"}}  // namespace {namespace}":
                inside = False
                continue
            if not inside or line.startswith((" ", "\t")):  # members and continued declarations
                continue
            match = DECLARATION.match(line)
            if match:
                if match.group(1) not in names:
                    names.append(match.group(1))
            elif not OTHER.match(line):
                sys.exit(f"{path}:{number}: raw_op_twins.py cannot read this line at namespace scope "
                         f"(teach it the form): {line}")
    if not names:
        sys.exit(f"{path}: no function declared in namespace {namespace}")
    return names


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ops_header, functions_header, output = sys.argv[1:]
    differentiable = set(declared_functions(functions_header, "tessera"))
    twins = [name for name in declared_functions(ops_header, "tessera::ops") if name in differentiable]
    entries = "".join(f'    "{name}",\n' for name in twins)
    with open(output, "w", encoding="utf-8") as file:
        file.write(
            "// Written by tensor/raw_op_twins.py from tensor/ops.h and autograd/functions.h at\n"
            "// build time: the raw ops whose differentiable twin has the same name.\n"
            "#pragma once\n\n"
            "#include <string_view>\n\n"
            "namespace tessera {\n\n"
            f"inline constexpr std::string_view kTwinsOfTheSameName[] = {{\n{entries}}};\n\n"
            "}  // namespace tessera\n")


if __name__ == "__main__":
    main()
