#!/usr/bin/env python3
"""The shell blocks of README.md and docs/*.md, run as a reader would.

Every ```sh block carries a mark on the line before it:
  <!-- test: run -->                 run here
  <!-- test: run if cuda-sim -->     run when the build has the cuda simulator
  <!-- test: skip (the reason) -->   not run, for the reason given
A block without a mark fails the test, so a new command cannot go untested
silently.

The run blocks are run in the order a reader meets the pages (README.md, then
each page in the order of its first link), each with `bash -e -o pipefail`.
Each page's blocks share a scratch directory of their own: it holds a link to
every top-level entry of the source tree, `build` is a link to the build
under test, and HOME is a scratch folder, so `build/examples/gpt/train ...`,
`examples/mlp/train_mlp.cpp` and `$HOME/.local` mean what they mean in a
checkout, and nothing a block writes lands in the source tree.

Before the blocks, `ninja -C BUILD` completes the build (the front page's
first command builds everything). A block may change the build's prefix
(the install block does); the prefix found at the start is put back at the
end, and recorded in BUILD so that a run killed midway is repaired by the
next one.

  run_shell_blocks.py --source DIR --build DIR [--cuda-sim 0|1] [--block-timeout S] [--page FILE]

Prints each block as it runs; a failure names the block (FILE:LINE), its
exit status and the end of its output. Exits 1 when a block failed or lacks
a mark.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import markdown_pages  # noqa: E402  (defines: reader_order, Page.shell_blocks)

OUTPUT_TAIL_LINES = 60


def parse_args():
    parser = argparse.ArgumentParser(description="Run the marked shell blocks of the docs.")
    parser.add_argument("--source", required=True, help="the source root (README.md, docs/)")
    parser.add_argument("--build", required=True, help="the build directory the blocks run against")
    parser.add_argument("--cuda-sim", default="0", choices=["0", "1"],
                        help="1 when the build has the cuda simulator ('run if cuda-sim' blocks)")
    parser.add_argument("--block-timeout", type=float, default=900,
                        help="seconds one block may take (generous: CI machines can be busy)")
    parser.add_argument("--page", action="append", default=[],
                        help="run only this page's blocks (repeatable; marks are checked on every page)")
    return parser.parse_args()


def build_prefix(build):
    options = subprocess.run(["meson", "introspect", build, "--buildoptions"], check=True,
                             capture_output=True, text=True).stdout
    return next(option["value"] for option in json.loads(options) if option["name"] == "prefix")


def restore_prefix(build, prefix):
    subprocess.run(["meson", "configure", build, f"--prefix={prefix}"], check=True,
                   stdout=subprocess.DEVNULL)
    # Regenerate now, so that meson install's plan names the prefix again.
    subprocess.run(["ninja", "-C", build, "build.ninja"], check=True, stdout=subprocess.DEVNULL)


def scratch_for(source, build):
    """A folder that looks like a checkout whose build/ is the build under test."""
    scratch = tempfile.mkdtemp(prefix="tessera-docs-")
    for name in sorted(os.listdir(source)):
        if name == ".git" or name == "build" or name.startswith("build-"):
            continue
        os.symlink(os.path.join(source, name), os.path.join(scratch, name))
    os.symlink(build, os.path.join(scratch, "build"))
    os.mkdir(os.path.join(scratch, "home"))
    return scratch


def run_block(page, block, scratch, timeout):
    where = f"{page.relpath}:{block['line']}"
    script = os.path.join(scratch, f".block-{block['line']}.sh")
    with open(script, "w", encoding="utf-8") as f:
        f.write(block["text"])
    env = dict(os.environ, HOME=os.path.join(scratch, "home"))
    print(f"docs: run {where}", flush=True)
    for line in block["text"].rstrip("\n").split("\n"):
        print(f"  $ {line}")
    started = time.monotonic()
    # A session of its own, so that a timeout ends the block's whole process group.
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", script], cwd=scratch, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        status = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        status = None
    seconds = time.monotonic() - started
    text = output.decode("utf-8", errors="replace")
    if status == 0:
        print(f"docs: ok   {where} ({seconds:.1f} s)", flush=True)
        return True
    tail = text.rstrip("\n").split("\n")[-OUTPUT_TAIL_LINES:]
    print(f"docs: its last {len(tail)} lines of output:")
    for line in tail:
        print(f"  | {line}")
    why = f"timed out after {timeout:.0f} s" if status is None else f"exit status {status}"
    print(f"docs: FAILED {where}: {why} ({seconds:.1f} s)", flush=True)
    return False


def main():
    args = parse_args()
    source = os.path.abspath(args.source)
    build = os.path.abspath(args.build)
    pages = markdown_pages.reader_order(source)

    unmarked = []
    plan = []
    for page in pages:
        blocks = page.shell_blocks()
        for block in blocks:
            if block["error"]:
                unmarked.append(f"{page.relpath}:{block['line']}: {block['error']}")
        for line in page.stray_marks(blocks):
            unmarked.append(f"{page.relpath}:{line}: a test mark with no shell block after it")
        plan.append((page, blocks))
    if unmarked:
        for line in unmarked:
            print(f"docs: FAILED {line}")
        return 1

    if args.page:
        plan = [(page, blocks) for page, blocks in plan if page.relpath in args.page]
    counts = {"run": 0, "skip": 0, "condition": 0}
    for page, blocks in plan:
        for block in blocks:
            if block["mark"] == "skip":
                counts["skip"] += 1
            elif block["condition"] == "cuda-sim" and args.cuda_sim != "1":
                counts["condition"] += 1
            else:
                counts["run"] += 1
    print(f"docs: {counts['run']} blocks to run, {counts['skip']} skipped by their mark, "
          f"{counts['condition']} skipped for a cuda simulator this build lacks; "
          f"pages in reading order: {', '.join(page.relpath for page, _ in plan)}", flush=True)

    record = os.path.join(build, "meson-private", "prefix-before-docs-blocks")
    if os.path.exists(record):
        with open(record, encoding="utf-8") as f:
            earlier = f.read().strip()
        print(f"docs: an earlier run left the build's prefix changed: restoring {earlier}")
        restore_prefix(build, earlier)
        os.remove(record)

    print(f"docs: ninja -C {build} (the front page's first command builds everything)", flush=True)
    built = subprocess.run(["ninja", "-C", build], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace")
    if built.returncode != 0:
        for line in built.stdout.rstrip("\n").split("\n")[-OUTPUT_TAIL_LINES:]:
            print(f"  | {line}")
        print(f"docs: FAILED ninja -C {build}: the build itself fails")
        return 1

    prefix = build_prefix(build)
    with open(record, "w", encoding="utf-8") as f:
        f.write(prefix + "\n")
    failed = []
    started = time.monotonic()
    try:
        for page, blocks in plan:
            runnable = [block for block in blocks if block["mark"] == "run"
                        and (block["condition"] != "cuda-sim" or args.cuda_sim == "1")]
            if not runnable:
                continue
            scratch = scratch_for(source, build)
            try:
                for block in runnable:
                    if not run_block(page, block, scratch, args.block_timeout):
                        failed.append(f"{page.relpath}:{block['line']}")
                        break  # the page's later blocks build on this one
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if build_prefix(build) != prefix:
            print(f"docs: putting the build's prefix back to {prefix}")
            restore_prefix(build, prefix)
        os.remove(record)
    seconds = time.monotonic() - started
    if failed:
        print(f"docs: {len(failed)} failed: {', '.join(failed)} ({seconds:.0f} s)")
        return 1
    print(f"docs: every run block passed ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
