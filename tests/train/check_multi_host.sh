#!/usr/bin/env bash
# Training across hosts, on one machine (multi_host_env.sh: hosts as network
# namespaces joined by veth links, OpenMPI over TCP with a launch agent).
# Checked, in deterministic mode:
#   - FSDP on 4 ranks over 2 hosts trains bitwise like --nproc 4 on one host,
#     and its traffic crossed the link;
#   - HSDP 2 x 2 over 2 hosts (shard groups within a host, replicas across
#     them) trains bitwise like --nproc 4 --hsdp 2;
#   - 3 ranks over 3 hosts (an odd world, uneven shards) like --nproc 3;
#   - the 2-host run's checkpoint resumes on one host and ends bitwise where
#     the 2-host run ended.
# Needs root, iproute2's `ip` and mpirun; without them it is skipped (exit 77)
# with the reason.
# Usage: check_multi_host.sh path/to/train
set -uo pipefail
source "$(dirname "$0")/multi_host_env.sh"
on_hosts 3 "$0" "$@"
set -e
train=$1

common=(--deterministic --batch 4 --seq-len 32 --threads 1 --eval-every 0)
limit=$mpirun_limit  # also for the runs on one host

failed_run() {  # the run's exit status and log, then fail
  local status=$?
  tail -n 30 "$work/log" >&2
  fail "$1 (exit $status)"
}
# across SLOTS ARGS...: train over the hosts (mpirun_over), its log in $work/log.
across() {
  local slots=$1
  shift
  mpirun_over "$slots" "$train" --backend mpi "$@" >"$work/log" 2>&1 ||
    failed_run "mpirun over hosts $slots: train $*"
}
# here_on_one_host ARGS...: the same ranks as threads of one process on one host.
here_on_one_host() {
  timeout --kill-after=10 "$limit" "$train" "$@" >"$work/log" 2>&1 || failed_run "train $*"
}
same_bits() {
  cmp -s "$1" "$2" || fail "$3: $(basename "$1") and $(basename "$2") differ"
  echo "multi-host: $3: bitwise equal"
}
received_by() { ip netns exec "$1" cat /sys/class/net/eth0/statistics/rx_bytes; }

before=$(received_by host-b)
across "2 2" "${common[@]}" --steps 6 --export "$work/fsdp_2hosts.safetensors" --ckpt-dir "$work/ckpt" --ckpt-every 3
crossed=$(($(received_by host-b) - before))
here_on_one_host "${common[@]}" --steps 6 --nproc 4 --export "$work/fsdp_1host.safetensors"
same_bits "$work/fsdp_2hosts.safetensors" "$work/fsdp_1host.safetensors" "FSDP, 4 ranks on 2 hosts against 1"
# 6 steps of all-gathers and reduce-scatters of the tiny model's 120k
# parameters (f32): each of host-b's ranks receives megabytes.
[ "$crossed" -gt 1000000 ] || fail "host-b received only $crossed bytes: did the ranks run across hosts?"
echo "multi-host: host-b received $crossed bytes over its link"

across "2 2" "${common[@]}" --steps 6 --hsdp 2 --export "$work/hsdp_2hosts.safetensors"
here_on_one_host "${common[@]}" --steps 6 --nproc 4 --hsdp 2 --export "$work/hsdp_1host.safetensors"
same_bits "$work/hsdp_2hosts.safetensors" "$work/hsdp_1host.safetensors" "HSDP 2 x 2 on 2 hosts against 1"

across "1 1 1" "${common[@]}" --steps 6 --export "$work/odd_3hosts.safetensors"
here_on_one_host "${common[@]}" --steps 6 --nproc 3 --export "$work/odd_1host.safetensors"
same_bits "$work/odd_3hosts.safetensors" "$work/odd_1host.safetensors" "FSDP, 3 ranks on 3 hosts against 1"

# The 2-host run saved at steps 3 and 6: without the last, a one-host run
# resumes from step 3 and must end where the 2-host run ended.
rm -rf "$work/ckpt/step-00000006"
here_on_one_host "${common[@]}" --steps 6 --nproc 4 --ckpt-dir "$work/ckpt" --resume \
  --export "$work/resumed_1host.safetensors"
grep -q 'step-00000003' "$work/log" || { tail -n 30 "$work/log"; fail "the one-host run did not resume from step 3"; }
same_bits "$work/resumed_1host.safetensors" "$work/fsdp_2hosts.safetensors" \
  "the 2-host run's step-3 checkpoint resumed on 1 host against the 2-host run's end"
