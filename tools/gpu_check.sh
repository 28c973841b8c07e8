#!/usr/bin/env bash
# The whole check of tessera on a real GPU, in one command, for a machine lent
# for minutes that has nvcc, PyTorch and compute-sanitizer but no package
# registry (carry .gpu-bundle/ from tools/gpu_bundle.sh along):
#
#   1. the machine: GPU, driver, nvcc, compilers, where cuBLASLt is;
#   2. the bundle's Debian packages unpacked into a private prefix;
#   3. the nvidia runtime built for this GPU's architecture only;
#   4. the cuda suite (every kernel against the cpu, on the GPU);
#   5. the tiny GPT trained on cuda and on cpu in f32, and on cuda with
#      --cpu-offload: losses within 1e-5;
#      NCCL's suite (tests/dist/test_nccl) and the tiny GPT over NCCL;
#      on every GPU, one process each (stage `multi`): the collectives
#      between GPUs, deterministic FSDP bitwise one GPU's, a checkpoint
#      resumed on one GPU, HSDP and an odd world (one GPU: the launch only);
#      tensor parallelism (stage `tp`, 2 GPUs or more): (shard N/2, tp 2)
#      against FSDP on N/2 GPUs on the same global batch, and async TP
#      against it, losses within 1e-5;
#   6. GPT-2 124M bf16 training steps at B = 16 and 32, T = 1024, beside
#      the PREDICTED step of bench/gpt2_step_prediction; B = 16 again with
#      --cpu-offload (stage `offload`), AdamW's host step whole before the
#      next forward and then overlapped with it: step times and device peaks;
#      B = 16 again with --float8 (stage `float8`): the block projections'
#      GEMMs in FP8 through cuBLASLt, beside the bf16 step;
#   7. PyTorch's GPT-2 124M on the same GPU and shapes (eager, torch.compile),
#      and the GEMM and copy rates the prediction is calibrated with;
#   8. compute-sanitizer's memcheck, synccheck, initcheck and racecheck;
#   9. ncu's time of every kernel of GPT-2 124M steps (B = 16, T = 1024);
#  10. (only when --stages names `profile`) ncu's full sections (throughput
#      of each unit, occupancy, warp stall reasons, shared-memory and
#      instruction statistics) for launches of the kernels matching
#      --profile-kernels (a regex; default the tensor-core attention's) in
#      the same GPT-2 run: where a kernel spends its time.
#
# 6-9 run in the order a short lease needs them most (B = 16, kernel times,
# PyTorch, memcheck, B = 32, the other sanitizers).
# Each stage has a time limit, cut to what is left of the run's budget
# (--budget, 520 s; limits ten times longer in the dry run); once it is
# spent the remaining stages are skipped and said so, so the report always
# comes back.
# Everything goes to one report file (and the raw logs beside it).
#
#   bash tools/gpu_check.sh [--out-dir DIR] [--budget SECONDS] [--archive FILE.tar.gz] [--sim] [--build DIR]
#                           [--stages suite,tiny,nccl,multi,tp,gpt2,float8,offload,ncu,torch,memcheck,synccheck,initcheck,racecheck,profile]
#                           [--profile-kernels REGEX]
#
# --stages runs only those (the build always): a second lease need not
# repeat what the first measured.
# --archive packs the report and every log into one file at the end (a lease
# may bring back only a few files).
# --sim is the dry run for a machine without a GPU: the same stages with the
# default simulator build (reduced GPT-2 shapes: the simulator runs on the
# CPU; compute-sanitizer's checks are the simulator's own, inside the suite).
# --build DIR uses a build already configured for the runtime wanted (the
# dry run: a developer's simulator build) instead of build-gpucheck/build,
# building the targets there as it is configured.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

out_dir=build-gpucheck/report
budget=520
sim=0
build=build-gpucheck/build
bundle=.gpu-bundle
archive=
default_stages=,suite,tiny,nccl,multi,tp,gpt2,float8,offload,ncu,torch,memcheck,synccheck,initcheck,racecheck,
all_stages=${default_stages}profile,
stages=$default_stages
profile_kernels='attention_mma'
while [ $# -gt 0 ]; do
  case $1 in
    --out-dir) out_dir=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --sim) sim=1; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    --stages) stages=",$2,"; shift 2 ;;
    --profile-kernels) profile_kernels=$2; shift 2 ;;
    *) echo "gpu_check: unknown argument $1 (see the comment at the top of tools/gpu_check.sh)" >&2; exit 2 ;;
  esac
done
for name in ${stages//,/ }; do
  [[ $all_stages == *",$name,"* ]] || { echo "gpu_check: --stages: no stage '$name' (${all_stages:1:-1})" >&2; exit 2; }
done
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
report=$out_dir/gpu_check_report.txt
: >"$report"
start_time=$SECONDS
failures=0
pack_logs() {
  [ -z "$archive" ] || tar czf "$archive" -C "$out_dir" .
}
trap pack_logs EXIT

say() {  # text: to the report and, as progress, to stdout
  printf '%s\n' "$*" | tee -a "$report"
}

# stage NAME LIMIT_SECONDS COMMAND...: runs COMMAND with its output in
# $out_dir/NAME.log, for at most LIMIT seconds and never past the budget.
# A shell function runs its long commands through `limited`, which applies
# the stage's limit to each.
stage_limit=0
stage() {
  local name=$1 limit=$2
  shift 2
  local elapsed=$((SECONDS - start_time))
  local left=$((budget - elapsed))
  if [ $left -lt 10 ]; then
    say "== $name: SKIPPED (the $budget s budget is spent)"
    return 3
  fi
  limit=$((limit * limit_scale))
  stage_limit=$((limit < left ? limit : left))
  say "== $name (at $elapsed s, limit $stage_limit s)"
  local begin=$SECONDS rc
  if [ "$(type -t "$1")" = function ]; then
    "$@" >"$out_dir/$name.log" 2>&1
  else
    limited "$@" >"$out_dir/$name.log" 2>&1
  fi
  rc=$?
  if [ $rc -eq 0 ]; then
    say "   ok in $((SECONDS - begin)) s"
  else
    failures=$((failures + 1))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      say "   TIMED OUT after $((SECONDS - begin)) s"
    else
      say "   FAILED (exit $rc) in $((SECONDS - begin)) s"
    fi
    tail -n 25 "$out_dir/$name.log" | sed 's/^/   | /' | tee -a "$report"
  fi
  return $rc
}
limited() {
  timeout --kill-after=5 "$stage_limit" "$@"
}

# ---- 1. the machine ----------------------------------------------------------------------------------
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
machine() {
  date -u
  uname -a
  nproc
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,clocks.max.sm --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -2
  g++ --version | head -1
  python3 -c 'import sys; print("python", sys.version.split()[0])'
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
  meson --version 2>&1 | sed 's/^/meson /'
  ninja --version 2>&1 | sed 's/^/ninja /'
  command -v compute-sanitizer ncu pkg-config 2>&1
  ldconfig -p | grep -E 'libcublasLt\.so|libcudart\.so|libnccl\.so' || true
}
machine >"$out_dir/machine.log" 2>&1
sed 's/^/   /' "$out_dir/machine.log" | tee -a "$report"

if [ $sim -eq 0 ] && ! command -v nvcc >/dev/null; then
  say "gpu_check: no nvcc on PATH (nor /usr/local/cuda/bin): this is not a CUDA machine; --sim runs the dry run"
  exit 1
fi
# The simulator runs kernels on the CPU, a few thousand times slower.
limit_scale=1
[ $sim -eq 1 ] && limit_scale=10
arch=
if [ $sim -eq 0 ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$arch" ] || arch=$(python3 -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null)
  [ -n "$arch" ] || { say "gpu_check: cannot tell the GPU's compute capability (nvidia-smi, torch)"; exit 1; }
  # The toolkit root for meson: where nvcc lives, unless CUDA_PATH says.
  export CUDA_PATH=${CUDA_PATH:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
fi

# ---- 2. the bundle -------------------------------------------------------------------------------------
prefix=$root/build-gpucheck/prefix
unpack_bundle() {
  [ -f "$bundle/MANIFEST" ] || { echo "no $bundle/MANIFEST: run tools/gpu_bundle.sh here first"; return 1; }
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local deb
  while read -r deb; do
    dpkg-deb -x "$bundle/$deb" "$prefix" || return 1
  done <"$bundle/MANIFEST"
  # The .pc files say prefix=/usr; point them at the private prefix.
  find "$prefix" -name '*.pc' -exec sed -i "s|=/usr|=$prefix/usr|g" {} +
  mkdir -p "$prefix/bin"
  printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s\nexec %s "$@"\n' "$prefix/usr/lib/x86_64-linux-gnu" \
    "$prefix/usr/bin/pkgconf" >"$prefix/bin/pkg-config"
  chmod +x "$prefix/bin/pkg-config"
  # The machine's own meson and ninja when it has them (new enough), the bundle's otherwise.
  if ! meson --version 2>/dev/null | grep -qE '^(1\.|[2-9])'; then
    printf '#!/bin/sh\nexport PYTHONPATH=%s\nexec python3 -m mesonbuild.mesonmain "$@"\n' \
      "$prefix/usr/lib/python3/dist-packages" >"$prefix/bin/meson"
    chmod +x "$prefix/bin/meson"
  fi
  command -v ninja >/dev/null || ln -sf "$prefix/usr/bin/ninja" "$prefix/bin/ninja"
  cat "$bundle/MANIFEST"
}
stage bundle 60 unpack_bundle || exit 1
export PATH="$prefix/bin:$PATH"
export PKG_CONFIG="$prefix/bin/pkg-config"
# Only the bundle's .pc files: the check proves the bundle suffices.
export PKG_CONFIG_LIBDIR="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
export CPLUS_INCLUDE_PATH="$prefix/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
export LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 3. the build --------------------------------------------------------------------------------------
# NCCL (the nccl stage): the toolkit's own, else the nvidia-nccl wheel that
# PyTorch brings, whose library has only its versioned name, so a private
# folder links libnccl.so to it.
nccl_args=()
find_nccl() {
  if [ -f "$CUDA_PATH/include/nccl.h" ]; then
    nccl_args=(-Dnccl=enabled)
    return
  fi
  local wheel
  wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || return
  [ -f "$wheel/include/nccl.h" ] && [ -f "$wheel/lib/libnccl.so.2" ] || return
  mkdir -p "$prefix/nccl/lib"
  ln -sfn "$wheel/include" "$prefix/nccl/include"
  ln -sf "$wheel/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so.2"
  ln -sf libnccl.so.2 "$prefix/nccl/lib/libnccl.so"
  nccl_args=(-Dnccl=enabled "-Dnccl_home=$prefix/nccl")
}
build_targets=(examples/gpt/train tests/cuda/test_cuda)
if [ $sim -eq 1 ]; then
  setup_args=(-Dmpi=disabled)
else
  find_nccl
  say "   NCCL: ${nccl_args[*]:-none found (the nccl stage is skipped)}"
  [ ${#nccl_args[@]} -gt 0 ] && build_targets+=(tests/dist/test_nccl)
  setup_args=(-Dgpu_runtime=nvidia "-Dgpu_architectures=$arch" -Dmpi=disabled -Dblas=disabled "${nccl_args[@]}")
fi
build_tessera() {
  if [ "$build" != build-gpucheck/build ] && [ -f "$build/meson-private/coredata.dat" ]; then
    limited ninja -C "$build" "${build_targets[@]}"  # --build: as it is configured
    return
  fi
  if [ -f "$build/meson-private/coredata.dat" ]; then
    limited meson setup --reconfigure "$build" "${setup_args[@]}" || return 1
  else
    limited meson setup "$build" --buildtype=release "${setup_args[@]}" || return 1
  fi
  limited ninja -C "$build" "${build_targets[@]}"
}
stage build 300 build_tessera || { say "gpu_check: the build failed; nothing else can run"; exit 1; }
train=$build/examples/gpt/train

# ---- 4. the cuda suite ---------------------------------------------------------------------------------
wanted() {  # stage: whether --stages names it
  [[ $stages == *",$1,"* ]]
}

if wanted suite; then
  stage cuda_suite 60 "$build/tests/cuda/test_cuda"
  grep -E '^\[doctest\] (test cases|assertions)' "$out_dir/cuda_suite.log" | sed 's/^/   /' | tee -a "$report"
fi

# ---- 5. tiny GPT, cuda against cpu ---------------------------------------------------------------------
tiny_steps=30
[ $sim -eq 1 ] && tiny_steps=5
tiny_run() {  # device [name and flags, for the log's name]
  local name=${2:-$1}
  limited "$train" --device "$1" --data synthetic --steps $tiny_steps --eval-every 0 --threads 4 \
    --log-json "$out_dir/tiny_$name.jsonl" --overwrite "${@:3}"
}
# compare_losses LABEL A B TOLERANCE: two runs' --log-json files (named
# tiny_A.jsonl, tiny_B.jsonl) step by step; a difference over TOLERANCE
# counts as a failure.
compare_losses() {
  python3 - "$1" "$2" "$3" "$4" "$out_dir" <<'EOF' | tee -a "$report"
import json, sys
label, a, b, tolerance, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
first, second = ([json.loads(line) for line in open(f"{out}/tiny_{name}.jsonl")] for name in (a, b))
worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(first, second))
verdict = "within" if worst <= tolerance else "NOT within"
median = sorted(r["step_ms"] for r in first[2:])[len(first[2:]) // 2]
print(f"   {label}, {len(first)} steps: largest |loss({a}) - loss({b})| = {worst:.3g}, {verdict} {tolerance:g};"
      f" {a} {median:.2f} ms/step (median after 2)")
sys.exit(0 if worst <= tolerance else 1)
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || failures=$((failures + 1))
}
if wanted tiny && stage tiny_cuda 60 tiny_run cuda && stage tiny_cpu 60 tiny_run cpu; then
  compare_losses "tiny GPT f32" cuda cpu 1e-5
  # CPU offload: pinned shards copied in on the copy-in stream, gradients
  # copied out on the reduce-scatter stream, AdamW on the cpu.
  if stage tiny_offload 60 tiny_run cuda offload --cpu-offload; then
    compare_losses "tiny GPT f32 with --cpu-offload" offload cpu 1e-5
  fi
  if stage tiny_offload_overlapped 60 tiny_run cuda offload_overlapped --cpu-offload --offload-step overlapped; then
    compare_losses "tiny GPT f32 with --cpu-offload --offload-step overlapped" offload_overlapped offload 0
  fi
fi

# ---- 5b. NCCL: the backend's suite, and the tiny GPT over NCCL against the local backend ---------------
if wanted nccl; then
  if [ ! -x "$build/tests/dist/test_nccl" ]; then
    say "== nccl: SKIPPED (no NCCL was found to build it)"
  else
    stage nccl 90 "$build/tests/dist/test_nccl"
    grep -E '^\[doctest\] (test cases|assertions)' "$out_dir/nccl.log" | sed 's/^/   /' | tee -a "$report"
    nccl_train() {
      limited "$train" --device cuda --backend nccl --data synthetic --steps $tiny_steps --eval-every 0 --threads 4 \
        --log-json "$out_dir/tiny_nccl.jsonl" --overwrite
    }
    if stage nccl_train 60 nccl_train && [ -f "$out_dir/tiny_cuda.jsonl" ]; then
      compare_losses "tiny GPT over NCCL (1 rank) against the local backend" nccl cuda 1e-6
    fi
  fi
fi

# ---- 5c. several GPUs: one process per GPU over NCCL ---------------------------------------------------
# Each rank is a process bound to cuda:<local rank> by torchrun-style
# variables, its store on this host. Checked:
#   - test_nccl's "nccl: " cases on every GPU: each collective, dtype and op
#     exact against every rank's contribution, deterministic mode bitwise the
#     rank-order reduction, ncclCommSplit sub-groups and HSDP's mesh,
#     coalesced groups;
#   - deterministic FSDP on P GPUs (P the largest power of two <= the GPUs)
#     ends with bitwise the weights of one GPU with P micro-batches; its
#     step-3 checkpoint resumes on one GPU and ends there bitwise too;
#   - HSDP 2 x P/2 (P >= 4) and FSDP on 3 GPUs (an odd world, uneven shards):
#     losses within 1e-5 of the one GPU's.
# NCCL takes one GPU a rank: on one GPU only the launch path runs (a world
# of one through the store), and the rest is reported NOT RUN. The dry run
# (--sim) trains the same comparisons on simulated GPUs as threads of one
# process (the local backend: the simulator has no NCCL).
gpu_count=4
[ $sim -eq 0 ] && gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# launch_ranks N COMMAND...: N processes of COMMAND with torchrun-style
# variables, each rank's output prefixed with its rank. A failed rank ends
# the others through the watchdog (TESSERA_DIST_TIMEOUT_S), else the limit.
launch_ranks() {
  local n=$1 port rank status=0
  shift
  port=$(free_port)
  local pids=()
  for ((rank = 0; rank < n; ++rank)); do
    (RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      TESSERA_DIST_TIMEOUT_S=60 limited "$@" 2>&1 | sed "s/^/[rank $rank] /"; exit "${PIPESTATUS[0]}") &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}
multi_common=(--device cuda --data synthetic --deterministic --clip 0 --threads 1 --eval-every 0 --steps 6
  --warmup 2 --overwrite)
[ $sim -eq 1 ] && multi_common+=(--batch 2 --seq-len 32)  # the simulator runs on the CPU
# train_on N NAME ARGS...: train on N GPUs (one process each over NCCL; in
# the dry run, threads of one process), rank 0's losses in tiny_NAME.jsonl.
train_on() {
  local n=$1 name=$2
  shift 2
  if [ $sim -eq 1 ]; then
    limited "$train" "${multi_common[@]}" --nproc "$n" --log-json "$out_dir/tiny_$name.jsonl" "$@"
  else
    launch_ranks "$n" "$train" "${multi_common[@]}" --backend nccl --log-json "$out_dir/tiny_$name.jsonl" "$@"
  fi
}
same_bits() {  # A B LABEL: two exported models, bitwise
  if cmp -s "$1" "$2"; then
    say "   $3: bitwise equal"
  else
    say "   $3: DIFFER"
    failures=$((failures + 1))
  fi
}
multi_gpu() {
  local p=1
  while [ $((p * 2)) -le "$gpu_count" ]; do p=$((p * 2)); done
  if [ $sim -eq 0 ]; then
    if [ ! -x "$build/tests/dist/test_nccl" ]; then
      say "== multi: SKIPPED (no NCCL was found to build it)"
      return
    fi
    stage multi_nccl 120 launch_ranks "$gpu_count" "$build/tests/dist/test_nccl" '--test-case=nccl: *'
    grep -E '\] \[doctest\] (test cases|assertions)' "$out_dir/multi_nccl.log" | sed 's/^/   /' | tee -a "$report"
    if [ "$gpu_count" -lt 2 ]; then
      say "   NOT RUN: collectives between GPUs, deterministic FSDP, HSDP and an odd world over NCCL" \
        "($gpu_count GPU here; NCCL takes one GPU a rank)"
      return
    fi
  fi
  local ckpt=$out_dir/multi_ckpt
  rm -rf "$ckpt"
  stage multi_fsdp 120 train_on "$p" multi_fsdp --export "$out_dir/multi_fsdp.safetensors" --ckpt-dir "$ckpt" \
    --ckpt-every 3 || return
  stage multi_one_gpu 120 train_on 1 multi_one --grad-accum "$p" --export "$out_dir/multi_one.safetensors" || return
  same_bits "$out_dir/multi_fsdp.safetensors" "$out_dir/multi_one.safetensors" \
    "deterministic FSDP on $p GPUs against 1 GPU with $p micro-batches"
  rm -rf "$ckpt/step-00000006"
  if stage multi_resume 120 train_on 1 multi_resume --grad-accum "$p" --ckpt-dir "$ckpt" --resume \
    --export "$out_dir/multi_resumed.safetensors"; then
    if ! grep -q 'step-00000003' "$out_dir/multi_resume.log"; then
      say "   the 1-GPU run did not say it resumed from step 3"
      failures=$((failures + 1))
    fi
    same_bits "$out_dir/multi_resumed.safetensors" "$out_dir/multi_fsdp.safetensors" \
      "the $p-GPU run's step-3 checkpoint resumed on 1 GPU against the $p-GPU run's end"
  fi
  if [ "$p" -ge 4 ] && stage multi_hsdp 120 train_on "$p" multi_hsdp --hsdp 2; then
    compare_losses "HSDP 2 x $((p / 2)) against 1 GPU with $p micro-batches" multi_hsdp multi_one 1e-5
  fi
  if [ "$gpu_count" -ge 3 ] && stage multi_one_gpu_3 120 train_on 1 multi_one_3 --grad-accum 3 &&
    stage multi_odd 120 train_on 3 multi_odd; then
    compare_losses "FSDP on 3 GPUs (uneven shards) against 1 GPU with 3 micro-batches" multi_odd multi_one_3 1e-5
  fi
}
! wanted multi || multi_gpu
# Tensor parallelism on the GPUs there are: tp 2 inside FSDP over the rest,
# the tp group's activations moved by NCCL (or the simulator's collectives).
tensor_parallel_gpus() {
  local p=1
  while [ $((p * 2)) -le "$gpu_count" ]; do p=$((p * 2)); done
  if [ "$p" -lt 2 ]; then
    say "== tp: NOT RUN ($gpu_count GPU here; tensor parallelism splits a layer over 2 GPUs or more)"
    return
  fi
  stage tp_fsdp 120 train_on "$p" tp_fsdp --tp 2 || return
  if stage tp_reference 120 train_on $((p / 2)) tp_reference; then
    compare_losses "(shard $((p / 2)), tp 2) against FSDP on $((p / 2)) GPU(s), the same global batch" tp_fsdp \
      tp_reference 1e-5
  fi
  if stage tp_async 120 train_on "$p" tp_async --tp 2 --async-tp 2; then
    compare_losses "async TP in 2 chunks against TP on $p GPUs" tp_async tp_fsdp 1e-5
  fi
}
! wanted tp || tensor_parallel_gpus

# ---- 6. GPT-2 124M bf16 --------------------------------------------------------------------------------
if [ $sim -eq 1 ]; then
  gpt2_shape=(--n-layer 1 --seq-len 64) gpt2_steps=2 gpt2_small_batch=1 gpt2_large_batch=2
else
  gpt2_shape=(--seq-len 1024) gpt2_steps=12 gpt2_small_batch=16 gpt2_large_batch=32
fi
gpt2_run() {  # name batch [flags]
  limited "$train" --device cuda --preset gpt2-124m --param-dtype bf16 --data synthetic --steps $gpt2_steps \
    --lr 6e-4 --warmup 0 --eval-every 0 "${gpt2_shape[@]}" --batch "$2" --log-json "$out_dir/$1.jsonl" --overwrite \
    "${@:3}"
}
# gpt2_timing BATCH [SUFFIX FLAGS...]: with flags (--cpu-offload) a run of
# its own, gpt2_bBATCH_SUFFIX, without the prediction (made for the plain step).
gpt2_timing() {
  local name=gpt2_b$1 label=""
  [ $# -gt 1 ] && name+=_$2 label=" ${*:3}"
  stage "$name" 60 gpt2_run "$name" "$1" "${@:3}" &&
    python3 - "$out_dir/$name.jsonl" "$1" "$root/bench/data/gpt2_h100_prediction.json" "$label" <<'EOF' | tee -a "$report"
import json, os, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
steady = [s["step_ms"] for s in steps[2:]] or [s["step_ms"] for s in steps]
median = statistics.median(steady)
line = (f"   tessera GPT-2 124M bf16 B={sys.argv[2]}{sys.argv[4]}: MEASURED {median:.1f} ms/step (median of "
        f"{len(steady)}, min {min(steady):.1f}), {steps[-1]['tokens_per_s'] / 1e3:.1f} k tokens/s, "
        f"peak {steps[-1]['peak_mem_bytes'] / 2**30:.2f} GiB")
if os.path.exists(sys.argv[3]) and not sys.argv[4]:
    predicted = json.load(open(sys.argv[3])).get("step_ms", {}).get(sys.argv[2])
    if predicted:
        line += f"; PREDICTED {predicted:.1f} ms (measured / predicted {median / predicted:.2f})"
print(line)
EOF
}

# ---- 7. PyTorch on the same GPU ------------------------------------------------------------------------
torch_timing() {
  if ! python3 -c 'import torch' 2>/dev/null; then
    say "== torch: SKIPPED (python3 has no torch)"
    return
  fi
  local torch_args=(--device cuda --batch 16 --seq-len 1024)
  [ $sim -eq 1 ] && torch_args=(--device cpu --n-layer 1 --batch 1 --seq-len 64 --steps 2 --warmup-steps 1 \
    --repeats 2 --no-compile)
  stage torch 150 env PYTHONUNBUFFERED=1 python3 bench/torch_gpu_step.py "${torch_args[@]}" \
    --out "$out_dir/torch_steps.json" --calibration "$out_dir/calibration.json"
  grep -E '^torch |^calibration: copy' "$out_dir/torch.log" | sed 's/^/   /' | tee -a "$report"
}

# ---- 8. compute-sanitizer -------------------------------------------------------------------------------
sanitizer() {  # tool [test cases]
  if [ $sim -eq 1 ]; then
    say "== compute-sanitizer $1: the simulator's own check of this kind ran inside cuda_suite"
    return
  fi
  command -v compute-sanitizer >/dev/null || { say "== compute-sanitizer: SKIPPED (not on PATH)"; return; }
  local tool=$1 limit=60
  shift
  [ "$tool" = memcheck ] && limit=90
  stage "sanitizer_$tool" $limit compute-sanitizer --tool "$tool" --print-limit 20 "$build/tests/cuda/test_cuda" "$@"
  grep -E 'ERROR SUMMARY|^\[doctest\] test cases' "$out_dir/sanitizer_$tool.log" | sed 's/^/   /' | tee -a "$report"
}

# ---- 9. ncu: every kernel's time in two GPT-2 124M steps at B = 16, T = 1024 -----------------------------------------------
kernel_times() {
  if [ $sim -eq 1 ]; then
    say "== ncu: SKIPPED (the dry run has no GPU)"
    return
  fi
  command -v ncu >/dev/null || { say "== ncu: SKIPPED (not on PATH)"; return; }
  stage ncu 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$out_dir/ncu_gpt2_b16_t1024.csv" "$train" --device cuda --preset gpt2-124m --param-dtype bf16 \
    --data synthetic --steps 2 --warmup 0 --eval-every 0 --batch 16 --seq-len 1024 &&
    python3 bench/ncu_kernel_times.py "$out_dir/ncu_gpt2_b16_t1024.csv" --steps 2 --batch 16 --seq-len 1024 \
      --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
      --commit "$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
      --out "$out_dir/kernel_times_b16.json" 2>&1 | sed 's/^/   /' | tee -a "$report"
}

# ---- 10. ncu's sections for chosen kernels ----------------------------------------------------------------------------
kernel_profile() {
  if [ $sim -eq 1 ]; then
    say "== profile: SKIPPED (the dry run has no GPU)"
    return
  fi
  command -v ncu >/dev/null || { say "== profile: SKIPPED (not on PATH)"; return; }
  # After 11 matching launches (the forward of 11 layers, for the attention's kernels), the next 3
  # (the attention: the last layer's forward, then its backward's two kernels).
  stage profile 120 ncu --clock-control none --set full -k "regex:$profile_kernels" --launch-skip 11 \
    --launch-count 3 --log-file "$out_dir/profile_kernels.txt" "$train" --device cuda --preset gpt2-124m \
    --param-dtype bf16 --data synthetic --steps 2 --warmup 0 --eval-every 0 --batch 16 --seq-len 1024 &&
    say "   ncu sections of the kernels matching /$profile_kernels/: profile_kernels.txt"
}

! wanted gpt2 || gpt2_timing $gpt2_small_batch
! wanted float8 || gpt2_timing $gpt2_small_batch float8 --float8
if wanted offload; then
  gpt2_timing $gpt2_small_batch offload --cpu-offload
  gpt2_timing $gpt2_small_batch offload_overlapped --cpu-offload --offload-step overlapped
  # The offloaded step's copies and host thread under memcheck: the tiny GPT, 3 steps.
  if [ $sim -eq 0 ] && command -v compute-sanitizer >/dev/null; then
    stage offload_memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
      "$train" --device cuda --cpu-offload --offload-step overlapped --data synthetic --steps 3 --eval-every 0 \
      --threads 4 &&
      grep -E 'ERROR SUMMARY' "$out_dir/offload_memcheck.log" | sed 's/^/   /' | tee -a "$report"
  fi
fi
! wanted ncu || kernel_times
! wanted profile || kernel_profile
! wanted torch || torch_timing
! wanted memcheck || sanitizer memcheck
! wanted gpt2 || gpt2_timing $gpt2_large_batch
! wanted synccheck || sanitizer synccheck
! wanted initcheck || sanitizer initcheck
# racecheck tracks every shared access and is slow: the kernels that use shared memory most.
! wanted racecheck || sanitizer racecheck -tc='*attention*,*softmax*,*norm*' -tce='*gradcheck*'

say "gpu_check: done in $((SECONDS - start_time)) s, $failures stage(s) failed; report $report"
[ $failures -eq 0 ]
