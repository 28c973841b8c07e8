#!/usr/bin/env bash
# The CPU-offloaded training step on a GPU, both ways of running AdamW's host
# step (train --offload-step overlapped|whole), at each intra-op thread count
# given and with OpenMP's idle threads as libgomp leaves them (spinning a
# while, then sleeping) or sleeping at once (OMP_WAIT_POLICY=passive): one line a variant with the median step time
# after 2 steps and the device peak. With --trace, a run of each also writes
# a Chrome trace (optimizer_wait: how long a group's copy-in waited for its
# host step; gradient_to_host_wait and accumulate_grad: the backward's end).
#
#   bash bench/offload_step.sh TRAIN [--out DIR] [--threads "16 8"] [--trace] [-- TRAIN-FLAGS...]
#
# TRAIN-FLAGS default to GPT-2 124M in bf16 at B = 16, T = 1024, 12 steps.
# Timings need a real GPU; on the simulator they say nothing of the overlap.
set -euo pipefail
train=$1
shift
out=build/offload_step
threads="$(nproc)"
trace=0
flags=(--preset gpt2-124m --param-dtype bf16 --batch 16 --seq-len 1024 --steps 12 --lr 6e-4 --warmup 0)
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --trace) trace=1; shift ;;
    --) shift; flags=("$@"); break ;;
    *) echo "offload_step: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
run() {  # name wait-policy(default|passive) step threads [extra flags]
  local policy=()
  [ "$2" = passive ] && policy=(OMP_WAIT_POLICY=passive)
  env "${policy[@]}" "$train" --device cuda --data synthetic --eval-every 0 --cpu-offload --offload-step "$3" \
    --threads "$4" "${flags[@]}" --log-json "$out/$1.jsonl" --overwrite "${@:5}" >"$out/$1.log" 2>&1 ||
    { tail -n 20 "$out/$1.log"; echo "offload_step: $1 failed" >&2; exit 1; }
  python3 - "$out/$1.jsonl" "$1" <<'PY'
import json, statistics, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
steady = [s["step_ms"] for s in steps[2:]] or [s["step_ms"] for s in steps]
print(f"{sys.argv[2]:<34} median {statistics.median(steady):7.1f} ms  min {min(steady):7.1f}  max {max(steady):7.1f}"
      f"  peak {steps[-1]['peak_mem_bytes'] / 2**30:.2f} GiB")
PY
}
for count in $threads; do
  for policy in default passive; do
    for step in whole overlapped; do
      run "${step}_${count}threads_$policy" "$policy" "$step" "$count"
    done
  done
done
if [ $trace -eq 1 ]; then
  first=${threads%% *}
  for step in whole overlapped; do
    run "${step}_traced" default "$step" "$first" --trace "$out/${step}_trace.json"
  done
fi
