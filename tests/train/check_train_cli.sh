#!/usr/bin/env bash
# The `train` command line around FSDP: --plan prints the sharding plan and
# exits 0 without training or starting a rank (a GPT's, a Llama 3 8B's and
# GPT-2 XL's over 1024 ranks, planned on meta); bad parallel settings,
# non-finite numbers, unbounded resources and another family's presets and
# flags exit non-zero with a message naming the flag.
# Usage: check_train_cli.sh path/to/train
set -euo pipefail
train=$1

plan=$("$train" --nproc 4 --plan)
for expected in "FSDP sharding plan of GPT over 4 ranks, mesh (shard=4)" "module (root)" "module blocks.0" \
  "blocks.1.mlp.fc.weight" "AdamW state" "communication per training step per rank" "total sent"; do
  grep -qF "$expected" <<<"$plan" || { echo "--plan output lacks '$expected':"; echo "$plan"; exit 1; }
done
if grep -q '^step ' <<<"$plan"; then echo "--plan trained:"; echo "$plan"; exit 1; fi

# A Llama too; Llama 3 8B on 8 ranks is planned from the model on meta, allocating nothing.
plan=$("$train" --model llama --preset llama3-8b --plan --nproc 8)
for expected in "model    llama3-8b (llama): n_layer 32, n_head 32, n_kv_head 8, n_embd 4096, F 14336" \
  "FSDP sharding plan of Llama over 8 ranks, mesh (shard=8)" "parameters            8030261248" \
  "parameter shards      4015130624 B (3.7 GiB)" "not in the plan (estimate_rank_memory"; do
  grep -qF "$expected" <<<"$plan" || { echo "--model llama --plan output lacks '$expected':"; echo "$plan"; exit 1; }
done

# Accumulating 4 micro-batches unsynced keeps Llama 3 8B's unsharded bf16
# gradients (15.0 GiB a rank); syncing each keeps none, for 4x the reduce-scatters.
for sync in last every; do
  plan=$("$train" --model llama --preset llama3-8b --plan --nproc 8 --param-dtype bf16 --reduce-dtype f32 \
    --grad-accum 4 --grad-sync "$sync")
  if [ "$sync" = last ]; then
    expected=("15\.5 GiB of gradients in flight" "\(4 micro-batches, synced last\), by kind"
      "FSDP all-gather \(shard group\) +260 calls" "FSDP reduce-scatter \(shard group\) +33 calls")
  else
    expected=("2\.9 GiB of gradients in flight" "\(4 micro-batches, synced every\), by kind"
      "FSDP all-gather \(shard group\) +260 calls" "FSDP reduce-scatter \(shard group\) +132 calls")
  fi
  for text in "${expected[@]}"; do
    grep -qE "$text" <<<"$plan" || { echo "--grad-sync $sync --plan output lacks '$text':"; echo "$plan"; exit 1; }
  done
done

# Tensor parallelism inside FSDP: the 3-D mesh, tp placements, and TP's bytes.
plan=$("$train" --nproc 4 --tp 2 --plan)
for expected in "FSDP sharding plan of GPT over 4 ranks, mesh (shard=2, tp=2)" "Shard(0) x 3 sections" \
  "Replicate, partial gradients" "TP activations' all-gather (tp group)" "total (the run's sent per rank)"; do
  grep -qF "$expected" <<<"$plan" || { echo "--tp 2 --plan output lacks '$expected':"; echo "$plan"; exit 1; }
done

# Any cluster: GPT-2 XL over 1024 ranks (more than a local run may start), and HSDP.
plan=$("$train" --preset gpt2-1558m --plan --nproc 1024 --hsdp 8)
for expected in "FSDP sharding plan of GPT over 1024 ranks, mesh (replicate=8, shard=128)" \
  "blocks.47.mlp.proj.weight" "unsharded peak" "all-reduce"; do
  grep -qF "$expected" <<<"$plan" || { echo "--plan --nproc 1024 output lacks '$expected':"; echo "$plan"; exit 1; }
done

# Each case: a piece of the message, then the flags.
program=$train
source "$(dirname "$0")/expect_failure.sh"
expect_failure "--hsdp 3 must divide the 4 ranks" --hsdp 3 --nproc 4
expect_failure "--reshard-after-forward 3 must divide the shard group size 4" --reshard-after-forward 3 --nproc 4
expect_failure "--param-dtype: f16x not in" --param-dtype f16x
expect_failure "--reduce-dtype: f64 not in" --reduce-dtype f64
expect_failure "--reshard-after-forward: expected true, false or a positive rank count, got 'maybe'" \
  --reshard-after-forward maybe
expect_failure "--nproc: must be in [1, 1048576], got 0" --nproc 0
expect_failure "--grad-sync: sometimes not in {last,every}" --grad-sync sometimes
expect_failure "--backend mpi needs a launcher" --backend mpi
# Numbers must be finite; resources are bounded before anything is allocated.
expect_failure "--lr: must be a finite number, got inf" --lr inf
expect_failure "--weight-decay: must be a finite number, got nan" --weight-decay nan
expect_failure "--clip: must be a finite number, got -inf" --clip -inf
expect_failure "--nproc 1000: more than 256 local ranks" --nproc 1000
expect_failure "--threads 999: 1 rank x 999 = 999 threads on" --threads 999
expect_failure "--allow-data-change is for --resume" --allow-data-change
expect_failure "--sweep is part of the plan: pass --plan --sweep" --sweep
expect_failure "--sweep-out plan.txt: its extension picks the format, .json or .csv" --plan --sweep --sweep-out plan.txt
# The model family's presets and flags.
expect_failure "--preset: llama-tiny not in" --preset llama-tiny
expect_failure "--preset: tiny not in" --model llama --preset tiny
expect_failure "--n-kv-head and --ffn-hidden shape a Llama" --n-kv-head 2
expect_failure "--model: bert not in {gpt,llama}" --model bert
echo "train: --plan and the FSDP flags' errors as expected"
