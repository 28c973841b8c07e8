#!/usr/bin/env bash
# Tensor parallelism against plain FSDP on 4 thread ranks, the same global
# batch: GPT-2 124M, (shard 2, tp 2) at 2 sequences per tp group against
# (shard 4) at 1 per rank, and (shard 2, tp 2) with async TP in 2 batch
# chunks (--async-tp 2), T = 1024, f32, synthetic data. One line each: the
# median step time after the first, the bytes each rank sends per step (FSDP's
# all-gathers and reduce-scatters, TP's activation collectives, the loss's and
# clipping's all-reduces) and the peak memory per rank. Timings on a 2-core
# machine are noisy: compare the lines of one run.
#
#   bash bench/tensor_parallel_step.sh TRAIN [--out DIR] [--steps N] [--seq-len T]
set -euo pipefail
train=$1
shift
out=build/tensor_parallel_step
steps=4
seq_len=1024
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seq-len) seq_len=$2; shift 2 ;;
    *) echo "tensor_parallel_step: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
run() {  # file-name label [train flags]
  local name=$1 label=$2
  shift 2
  "$train" --preset gpt2-124m --nproc 4 --seq-len "$seq_len" --steps "$steps" --data synthetic --eval-every 0 \
    --log-json "$out/$name.jsonl" --overwrite "$@" >"$out/$name.log" 2>&1 ||
    { tail -n 20 "$out/$name.log"; echo "tensor_parallel_step: $name failed" >&2; exit 1; }
  python3 - "$out/$name.jsonl" "$label" <<'PY'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
steady = [s["step_ms"] for s in steps[1:]] or [s["step_ms"] for s in steps]
mib = 1024 * 1024
print(f"{sys.argv[2]:<22} step {statistics.median(steady):9.1f} ms   sent/rank {steps[-1]['comm_bytes'] / mib:7.1f} MiB"
      f"   peak/rank {max(s['peak_mem_bytes'] for s in steps) / mib:7.1f} MiB   loss {steps[-1]['loss']:.4f}")
PY
}
echo "GPT-2 124M, 4 thread ranks, 4 sequences of $seq_len tokens a step, $steps steps ($(nproc) cores)"
run fsdp "fsdp (shard 4)" --batch 1
run fsdp_tp "fsdp x tp (2, 2)" --batch 2 --tp 2
run fsdp_async_tp "fsdp x async tp (2, 2)" --batch 2 --tp 2 --async-tp 2
