#!/usr/bin/env bash
# float8 training against bf16's seed-to-seed spread: a small Llama
# (llama-tiny, byte-level default corpus) trained 1000 steps with bf16
# parameters on seeds 1, 2 and 3, and with --float8 (bf16 parameters too) on
# seed 1. The losses are averaged over windows of 50 steps; the float8 run's
# window means are compared with the band the three bf16 runs span.
# Usage: bench/float8_loss_band.sh BUILD_DIR [STEPS [TRAIN FLAGS...]]   (prints the log)
# (extra flags reshape the model, e.g. --n-embd 256 --n-head 8)
set -euo pipefail
build=$1
steps=${2:-1000}
extra=("${@:3}")
dir=$(mktemp -d /tmp/tessera-float8-band-XXXXXX)
trap 'rm -rf "$dir"' EXIT
common=(--model llama --preset llama-tiny --param-dtype bf16 --steps "$steps" --batch 8 --seq-len 64 --eval-every 0
  --warmup 50 "${extra[@]}")
echo "commit $(git -C "$(dirname "$0")" rev-parse HEAD), $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "train ${common[*]} [--seed S] [--float8]"
for seed in 1 2 3; do
  "$build/examples/gpt/train" "${common[@]}" --seed "$seed" --log-json "$dir/bf16_$seed.jsonl" >"$dir/bf16_$seed.log" 2>&1
  echo "bf16 seed $seed: $(grep -E '^done' "$dir/bf16_$seed.log")"
done
"$build/examples/gpt/train" "${common[@]}" --seed 1 --float8 --log-json "$dir/float8.jsonl" >"$dir/float8.log" 2>&1
echo "float8 seed 1: $(grep -E '^done' "$dir/float8.log")"
python3 - "$dir" <<'PY'
import json, sys
def losses(name):
    return [json.loads(line)["loss"] for line in open(f"{sys.argv[1]}/{name}.jsonl")]
def windows(values, width=50):
    return [sum(values[i:i + width]) / width for i in range(0, len(values) - width + 1, width)]
bf16 = [windows(losses(f"bf16_{seed}")) for seed in (1, 2, 3)]
float8 = windows(losses("float8"))
inside, worst = 0, 0.0
print("window  bf16 low  bf16 high  float8")
for index, value in enumerate(float8):
    low, high = min(run[index] for run in bf16), max(run[index] for run in bf16)
    outside = max(low - value, value - high, 0.0)
    inside += outside == 0.0
    worst = max(worst, outside)
    print(f"{(index + 1) * 50:6d}  {low:8.4f}  {high:9.4f}  {value:6.4f}{'' if outside == 0.0 else f'  outside by {outside:.4f}'}")
print(f"float8 window means inside the bf16 seeds' band: {inside} of {len(float8)}; farthest outside {worst:.4f}")
PY
