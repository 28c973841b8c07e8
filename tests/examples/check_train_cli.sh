#!/usr/bin/env bash
# The `train` command line around FSDP: --plan prints the sharding plan and
# exits 0 without training; bad parallel settings, non-finite numbers and
# unbounded resources exit non-zero with a message naming the flag.
# Usage: check_train_cli.sh path/to/train
set -euo pipefail
train=$1

plan=$("$train" --nproc 4 --plan)
for expected in "FSDP sharding plan" "mesh DeviceMesh(cpu, (shard=4)" "module (root)" "module blocks.0" \
  "blocks.1.mlp.fc.weight" "AdamW state" "communication per training step per rank" "total sent"; do
  grep -qF "$expected" <<<"$plan" || { echo "--plan output lacks '$expected':"; echo "$plan"; exit 1; }
done
if grep -q '^step ' <<<"$plan"; then echo "--plan trained:"; echo "$plan"; exit 1; fi

# Each case: a piece of the message, then the flags.
program=$train
source "$(dirname "$0")/expect_failure.sh"
expect_failure "--hsdp 3 must divide the 4 ranks" --hsdp 3 --nproc 4
expect_failure "--reshard-after-forward 3 must divide the shard group size 4" --reshard-after-forward 3 --nproc 4
expect_failure "--param-dtype: f16x not in" --param-dtype f16x
expect_failure "--reduce-dtype: f64 not in" --reduce-dtype f64
expect_failure "--reshard-after-forward: expected true, false or a positive rank count, got 'maybe'" \
  --reshard-after-forward maybe
expect_failure "--nproc: must be > 0, got 0" --nproc 0
expect_failure "--backend mpi needs a launcher" --backend mpi
# Numbers must be finite; resources are bounded before anything is allocated.
expect_failure "--lr: must be a finite number, got inf" --lr inf
expect_failure "--weight-decay: must be a finite number, got nan" --weight-decay nan
expect_failure "--clip: must be a finite number, got -inf" --clip -inf
expect_failure "--nproc 1000: more than 256 local ranks" --nproc 1000
expect_failure "--threads 999: 1 rank x 999 = 999 threads on" --threads 999
expect_failure "--allow-data-change is for --resume" --allow-data-change
echo "train: --plan and the FSDP flags' errors as expected"
