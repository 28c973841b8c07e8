# Sourced by the multi-host checks: "hosts" on one machine, for OpenMPI.
#
# Each host is a network namespace with its own hostname and an eth0 joined
# to a bridge (the switch) by a veth link; host i has 10.231.7.(i+1)/24. The
# script that sources this runs itself again inside a private network and
# mount namespace (on_hosts), so its traffic cannot leave
# and the namespaces, links and mounts vanish with it however it ends.
# OpenMPI reaches the hosts through a launch agent (its rsh agent) that runs
# a command inside a host's namespace where it would use ssh.

skip() { echo "multi-host: skipped: $*"; exit 77; }
fail() { echo "multi-host: FAILED: $*" >&2; exit 1; }

# on_hosts COUNT SCRIPT ARGS...: outside, checks what the hosts need
# (skipping with the reason when something is missing) and runs SCRIPT
# ARGS... --inside in fresh namespaces in place of this process; inside
# (the last argument is --inside), makes COUNT hosts (make_hosts) and returns.
on_hosts() {
  local count=$1 script
  script=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
  shift 2
  if [ "${!#}" = --inside ]; then
    make_hosts "$count" "$(mktemp -d)"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || skip "network namespaces and veth links need root"
  command -v ip >/dev/null || skip "iproute2's ip is not installed (tools/setup.sh installs it)"
  command -v mpirun >/dev/null || skip "mpirun is not installed"
  command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
  unshare --mount --net --uts true 2>/dev/null || skip "unshare cannot make network namespaces here"
  exec unshare --mount --net --uts --propagation private bash "$script" "$@" --inside
}

hosts=()
address_of() { echo "10.231.7.$(($1 + 1))"; }  # host i's address; 10.231.7.0/24 exists only in here

# make_hosts COUNT WORK_DIR: the hosts host-a, host-b, ..., the switch and
# the agent WORK_DIR/agent.sh. Kills what is left on the hosts and removes
# WORK_DIR at exit.
make_hosts() {
  local count=$1 names=(host-a host-b host-c host-d) i host
  work=$2
  trap 'for host in "${hosts[@]}"; do ip netns pids "$host" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
        rm -rf "$work"' EXIT
  hosts=("${names[@]:0:count}")
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
  # Called as `agent HOST COMMAND...` like ssh: the command runs as a shell
  # line in HOST's namespace, with HOST's hostname (two nodes with one name
  # would look like one node to OpenMPI).
  {
    echo '#!/usr/bin/env bash'
    echo 'address=$1; shift'
    echo 'case $address in'
    for i in "${!hosts[@]}"; do echo "  $(address_of "$i")) host=${hosts[$i]} ;;"; done
    echo '  *) echo "agent: no host at $address" >&2; exit 1 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"'
  } >"$work/agent.sh"
  chmod +x "$work/agent.sh"
}

# The mpirun options a multi-host job needs, each for a reason:
#   --mca plm_rsh_agent       the hosts are reached through the agent, not ssh;
#   --mca btl tcp,self,vader  TCP between hosts, shared memory within one;
#   --mca *_if_include        the hosts' network only;
#   --mca oob_tcp_keepalive_* mpirun and its daemons notice a lost host in
#                             about 5 s (the defaults, 300 s then 9 x 20 s,
#                             left mpirun waiting after a cut link while every
#                             rank had already ended).
multi_host_mpirun_options=(--allow-run-as-root --bind-to none
  --mca btl tcp,self,vader --mca btl_tcp_if_include 10.231.7.0/24 --mca oob_tcp_if_include 10.231.7.0/24
  --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3)

# mpirun_over SLOTS COMMAND...: mpirun on host-a runs COMMAND over the first
# hosts, SLOTS ranks on each (a list: "2 2" is 2 ranks on host-a and 2 on
# host-b), placed host by host. Environment variables named in
# $forwarded_variables reach every rank; $launcher, when set, is the
# supervisor mpirun runs under (tools/launch and its flags, ending in --).
# mpirun is killed after $mpirun_limit seconds, so that a hang fails the
# check instead of holding it; the limit is far above what the runs take,
# so a busy machine does not reach it.
forwarded_variables=()
launcher=()
mpirun_limit=300
mpirun_over() {
  local slots=($1)
  shift
  local hostfile=$work/hostfile ranks=0 i forward=()
  : >"$hostfile"
  for i in "${!slots[@]}"; do
    echo "$(address_of "$i") slots=${slots[$i]}" >>"$hostfile"
    ranks=$((ranks + slots[i]))
  done
  for i in "${forwarded_variables[@]}"; do forward+=(-x "$i"); done
  ip netns exec host-a unshare --uts sh -c 'hostname host-a; exec "$@"' sh \
    timeout --kill-after=10 "$mpirun_limit" "${launcher[@]}" \
    mpirun "${multi_host_mpirun_options[@]}" --mca plm_rsh_agent "$work/agent.sh" "${forward[@]}" \
    -np "$ranks" --hostfile "$hostfile" "$@"
}

# The processes left on HOST.
processes_on() { ip netns pids "$1" | xargs -r ps -o comm= -p | tr '\n' ' '; }
