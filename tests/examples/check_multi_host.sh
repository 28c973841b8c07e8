#!/usr/bin/env bash
# Training across hosts, on one machine: "hosts" are network namespaces with
# their own hostnames, joined through a bridge by veth links, and OpenMPI
# reaches them over TCP with a launch agent (its rsh agent) that runs a
# command inside a host's namespace instead of over ssh. The whole test runs
# in a private network and mount namespace (unshare), so its traffic cannot
# leave it and the namespaces, links and mounts vanish with it however it
# ends. Checked, in deterministic mode:
#   - FSDP on 4 ranks over 2 hosts trains bitwise like --nproc 4 on one host,
#     and its traffic crossed the link;
#   - HSDP 2 x 2 over 2 hosts (shard groups within a host, replicas across
#     them) trains bitwise like --nproc 4 --hsdp 2;
#   - 3 ranks over 3 hosts (an odd world, uneven shards) like --nproc 3;
#   - the 2-host run's checkpoint resumes on one host and ends bitwise where
#     the 2-host run ended.
# Needs root (namespaces, veth links), iproute2's `ip` and mpirun; without
# them it is skipped (exit 77) with the reason.
# Usage: check_multi_host.sh path/to/train
set -uo pipefail
train=$1
here=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

skip() { echo "multi-host: skipped: $*"; exit 77; }

if [ "${2:-}" != --inside ]; then
  [ "$(id -u)" -eq 0 ] || skip "network namespaces and veth links need root"
  command -v ip >/dev/null || skip "iproute2's ip is not installed (tools/setup.sh installs it)"
  command -v mpirun >/dev/null || skip "mpirun is not installed"
  command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
  unshare --mount --net --uts true 2>/dev/null || skip "unshare cannot make network namespaces here"
  exec unshare --mount --net --uts --propagation private bash "$here" "$train" --inside
fi

# ---- inside the private namespaces --------------------------------------------------------------
set -e
work=$(mktemp -d)
hosts=(host-a host-b host-c)
address_of() { echo "10.231.7.$(($1 + 1))"; }  # host i's address; 10.231.7.0/24 exists only in here
cleanup() {
  for host in "${hosts[@]}"; do ip netns pids "$host" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "multi-host: FAILED: $*" >&2; exit 1; }

# /run/netns in this mount namespace only: the hosts' names never reach the machine's.
mkdir -p /run/netns
mount -t tmpfs tmpfs /run/netns
ip link set lo up
ip link add switch type bridge
ip link set switch up
for i in "${!hosts[@]}"; do
  host=${hosts[$i]}
  ip netns add "$host"
  ip link add "port-$i" type veth peer name eth0 netns "$host"
  ip link set "port-$i" master switch up
  ip -n "$host" addr add "$(address_of "$i")/24" dev eth0
  ip -n "$host" link set eth0 up
  ip -n "$host" link set lo up
done

# OpenMPI's rsh agent, called as `agent HOST COMMAND...` like ssh: the command
# runs as a shell line in HOST's network namespace, with HOST's hostname (two
# nodes with one name would look like one node to OpenMPI).
agent=$work/agent.sh
{
  echo '#!/usr/bin/env bash'
  echo 'address=$1; shift'
  echo 'case $address in'
  for i in "${!hosts[@]}"; do echo "  $(address_of "$i")) host=${hosts[$i]} ;;"; done
  echo '  *) echo "agent: no host at $address" >&2; exit 1 ;;'
  echo 'esac'
  echo 'exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"'
} >"$agent"
chmod +x "$agent"

common=(--deterministic --batch 4 --seq-len 32 --threads 1 --eval-every 0)
# A run is bounded so that a hang fails the test; the bound is far above the
# seconds these take, so a busy machine does not fail it.
limit=240

failed_run() {  # what: the run's exit status and log, then fail
  local status=$?
  tail -n 30 "$work/log" >&2
  fail "$1 (exit $status)"
}

# across SLOTS ARGS...: mpirun from host-a over the first hosts, SLOTS ranks
# on each (a list: "2 2" is 2 ranks on host-a and 2 on host-b), ranks placed
# host by host; train's log in $work/log.
across() {
  local slots=($1)
  shift
  local hostfile=$work/hostfile ranks=0 i
  : >"$hostfile"
  for i in "${!slots[@]}"; do
    echo "$(address_of "$i") slots=${slots[$i]}" >>"$hostfile"
    ranks=$((ranks + slots[i]))
  done
  ip netns exec host-a unshare --uts sh -c 'hostname host-a; exec "$@"' sh \
    timeout --kill-after=10 "$limit" mpirun --allow-run-as-root --bind-to none -np "$ranks" --hostfile "$hostfile" \
    --mca plm_rsh_agent "$agent" --mca btl tcp,self,vader \
    --mca btl_tcp_if_include 10.231.7.0/24 --mca oob_tcp_if_include 10.231.7.0/24 \
    "$train" --backend mpi "$@" >"$work/log" 2>&1 || failed_run "mpirun over hosts ${slots[*]}: train $*"
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
