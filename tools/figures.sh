#!/usr/bin/env bash
# The pictures of docs/, from real runs. The README's first_run_loss.svg is
# the loss curve of README command 1's job (tools/first_run.sh, about a
# minute). Then the pictures of docs/fsdp_step_by_step.md: builds
# examples/fsdp_figures and runs it three times, writing SVGs and a JSON data
# file per run into docs/figures/ (or the directory given):
#   fsdp_step_*             fully_shard and NaiveFSDP on 4 ranks (the defaults)
#   fsdp_step_no_reshard_*  the same with --reshard-after-forward false
#   fsdp_step_hsdp_*        the same on an HSDP 2x2 mesh (--hsdp 2)
# and those of docs/tp_step_by_step.md: examples/fsdp_figures/tp_figures,
#   tp_step_*               tensor parallelism inside FSDP, (dp 2, tp 2)
# The examples test 'fsdp figures match the run they draw' runs the same
# program into a temporary directory and checks every picture against its data.
#   tools/figures.sh [OUT_DIR]     (BUILD=dir picks the build, default build/)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD:-build}
out=${1:-docs/figures}
[ -d "$build/meson-private" ] || meson setup "$build"
TESSERA_BUILD_DIR="$build" bash tools/first_run.sh
cp "$build/first-run/loss.svg" "$out/first_run_loss.svg"

ninja -C "$build" examples/fsdp_figures/fsdp_figures examples/fsdp_figures/tp_figures
figures="$build/examples/fsdp_figures/fsdp_figures"

"$figures" --out "$out"
"$figures" --out "$out" --name fsdp_step_no_reshard --reshard-after-forward false
"$figures" --out "$out" --name fsdp_step_hsdp --hsdp 2
"$build/examples/fsdp_figures/tp_figures" --out "$out"
