#!/usr/bin/env bash
# Runs `train` for 3 steps with --log-json and checks the file: one JSON object
# per step, each with the required keys, val_loss on the last (evaluated) one,
# a positive per-rank peak memory, and comm_bytes as expected (0 on one rank,
# where a group of one moves nothing; > 0 on several).
# Usage: check_log_json.sh path/to/train zero|positive [more train flags...]
set -euo pipefail
train=$1
comm=$2
shift 2
log=$(mktemp /tmp/tessera-log-XXXXXX.jsonl)
trap 'rm -f "$log"' EXIT

"$train" --steps 3 --batch 4 --eval-every 3 --eval-batches 1 --log-json "$log" "$@"

lines=$(wc -l <"$log")
[ "$lines" -eq 3 ] || { echo "expected 3 lines in $log, got $lines"; exit 1; }
objects=$(grep -c '^{.*}$' "$log" || true)
[ "$objects" -eq 3 ] || { echo "expected 3 one-line JSON objects:"; cat "$log"; exit 1; }
for key in step loss lr grad_norm step_ms tokens_per_s peak_mem_bytes comm_bytes; do
  with_key=$(grep -cE "[{,]\"$key\":[-0-9.e+]+[,}]" "$log" || true)
  [ "$with_key" -eq 3 ] || { echo "key '$key' is on $with_key of 3 lines:"; cat "$log"; exit 1; }
done
for step in 1 2 3; do
  grep -q "\"step\":$step[,}]" "$log" || { echo "no line for step $step:"; cat "$log"; exit 1; }
done
tail -n 1 "$log" | grep -q '"val_loss":[0-9]' || { echo "the last line has no val_loss:"; cat "$log"; exit 1; }
with_memory=$(grep -cE '"peak_mem_bytes":[1-9][0-9]*[,}]' "$log" || true)
[ "$with_memory" -eq 3 ] || { echo "peak_mem_bytes is not positive on every line:"; cat "$log"; exit 1; }
case $comm in
  zero) pattern='"comm_bytes":0[,}]' ;;
  positive) pattern='"comm_bytes":[1-9][0-9]*[,}]' ;;
  *) echo "usage: check_log_json.sh TRAIN zero|positive [flags...]"; exit 2 ;;
esac
with_comm=$(grep -cE "$pattern" "$log" || true)
[ "$with_comm" -eq 3 ] || { echo "comm_bytes is not $comm on every line:"; cat "$log"; exit 1; }
echo "log-json ($*): 3 lines with every key, comm_bytes $comm"
