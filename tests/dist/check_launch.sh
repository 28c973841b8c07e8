#!/usr/bin/env bash
# tools/launch around jobs on this machine (the multi-host check runs it
# across hosts): what it says and how it ends the job.
#   - a clean MPI job: exit 0, every rank done, each named with its host;
#   - a rank that fails: the launcher names it and its error as the first failure;
#   - a job that does not end after a rank was lost: SIGTERM to its process
#     group after --grace-s, SIGKILL 5 s later when SIGTERM is ignored;
#   - it listens on loopback for a job on this host, and only where --address says;
#   - a stranger who knows the port but not the job secret changes nothing,
#     and neither do hellos that do not fit the job (an absurd world size, a
#     rank twice), nor a flood of idle connections with too few descriptors
#     (one log line, no spin);
#   - usage errors exit 2.
# The ranks of all but the first two are bash processes speaking the
# lifeline protocol (dist/launch/lifeline.h) through /dev/tcp, so that they
# can misbehave.
# Usage: check_launch.sh path/to/launch path/to/test_dist_mpi MPIRUN MPIRUN-FLAGS...
set -uo pipefail
launch=$1 test_dist_mpi=$2
shift 2
mpirun=("$@")
fail() { echo "check_launch: FAILED: $*" >&2; exit 1; }
log=$(mktemp)
flag=$(mktemp -u)
trap 'rm -f "$log" "$flag" "$flag".*' EXIT
says() {  # CASE PATTERN...: the log holds each extended regular expression
  local case=$1
  shift
  for pattern in "$@"; do
    grep -qE -- "$pattern" "$log" || { cat "$log" >&2; fail "$case: the log does not say /$pattern/"; }
  done
}
host=$(hostname)
wait_for_file() {  # FILE WHAT: until FILE exists, 60 s at most
  for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done
  cat "$log" >&2
  fail "$2 did not happen within 60 s"
}
# start_launcher ARGS...: tools/launch in the background ($launcher), its
# log in $log, emptied first: now, not when the background job gets to it,
# so that launcher_port cannot read the last run's port.
start_launcher() {
  : >"$log"
  "$launch" "$@" >"$log" 2>&1 &
  launcher=$!
}
launcher_port() {  # the port of the launcher writing $log, once it has said it
  local port
  for _ in $(seq 600); do
    port=$(sed -nE 's/.*tessera launch: lifelines at 127\.0\.0\.1:([0-9]+);.*/\1/p' "$log")
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.1
  done
  cat "$log" >&2
  fail "the launcher did not say where it listens within 60 s"
}
# One rank (a world of one) that says hello with the job's secret, beats
# until $flag exists (300 s at most), then says done. With "misfits" it
# first sends, from further connections of its own process (it has the
# secret), hellos that do not fit the job: an absurd world size, the
# issue's line, and its own rank again.
one_rank_job='
  IFS=: read -r address port <<<"$TESSERA_LAUNCHER"
  exec 3<>"/dev/tcp/$address/$port"
  echo "hello $TESSERA_JOB_SECRET 0 1 $$ fake-host" >&3
  if [ "$2" = misfits ]; then
    for line in "hello $TESSERA_JOB_SECRET 5 2147483647 1 h" "hello 5 2147483647 1 h" \
                "hello $TESSERA_JOB_SECRET 0 1 $$ fake-host"; do
      exec 4<>"/dev/tcp/$address/$port"
      printf "%s\nfailed a misfit\n" "$line" >&4
      exec 4>&-
    done
  fi
  : >"$1.hello"
  for _ in $(seq 1500); do [ -e "$1" ] && break; echo beat >&3; sleep 0.2; done
  echo done >&3'

# ---- a clean job ----
"$launch" -- "${mpirun[@]}" -np 2 "$test_dist_mpi" >"$log" 2>&1 || { cat "$log" >&2; fail "a clean job failed"; }
says "clean job" "tessera launch: mpirun exited 0 after" "tessera launch: $host: rank 0 done, rank 1 done" \
  "tessera launch: lifelines at 127\.0\.0\.1:[0-9]+; running .*mpirun"
grep -q "first failure" "$log" && { cat "$log" >&2; fail "a clean job has a first failure"; }
echo "check_launch: a clean job: exit 0, both ranks done on $host"

# ---- a rank fails ----
status=0
"$launch" -- "${mpirun[@]}" -np 2 "$test_dist_mpi" --test-case='mpi init*' --no-skip >"$log" 2>&1 || status=$?
[ $status -ne 0 ] || fail "a failing job exited 0"
says "rank failure" "tessera launch: first failure: rank 1 on $host \(pid [0-9]+\) failed [0-9.]+ s in: tessera: rank 1 of 2 failed: rank 1 gave up"
echo "check_launch: a rank's failure: exit $status, named as the first failure"

# ---- a job that does not end after a rank was lost ----
# One rank says hello and dies; the other lives on and, in the second run,
# ignores SIGTERM. Each run sleeps far longer than the check may take.
fake_job='
  IFS=: read -r address port <<<"$TESSERA_LAUNCHER"
  ( exec 3<>"/dev/tcp/$address/$port"; echo "hello $TESSERA_JOB_SECRET 0 2 $BASHPID fake-host" >&3; kill -9 $BASHPID ) &
  exec 4<>"/dev/tcp/$address/$port"
  echo "hello $TESSERA_JOB_SECRET 1 2 $$ fake-host" >&4
  [ "$1" = ignore-term ] && trap "" TERM
  for _ in $(seq 600); do echo beat >&4; sleep 0.2; done'
start=$SECONDS
status=0
"$launch" --grace-s 1 -- bash -c "$fake_job" fake-job >"$log" 2>&1 || status=$?
[ $status -eq 143 ] || { cat "$log" >&2; fail "a job ended by SIGTERM: exit $status, not 143"; }
[ $((SECONDS - start)) -lt 60 ] || fail "the teardown took $((SECONDS - start)) s"
says "teardown" "tessera launch: rank 0 on fake-host \(pid [0-9]+\) lost" \
  "the job did not end within 1 s of the failure: SIGTERM to its process group" \
  "tessera launch: bash was killed by signal 15" "tessera launch: fake-host: rank 0 lost, rank 1 lost"
grep -q "SIGKILL" "$log" && { cat "$log" >&2; fail "SIGKILL was sent to a job that took SIGTERM"; }
status=0
"$launch" --grace-s 1 -- bash -c "$fake_job" fake-job ignore-term >"$log" 2>&1 || status=$?
[ $status -eq 137 ] || { cat "$log" >&2; fail "a job that ignores SIGTERM: exit $status, not 137"; }
says "teardown" "still running 5 s after SIGTERM: SIGKILL to its process group" \
  "tessera launch: bash was killed by signal 9"
echo "check_launch: a job that does not end after a loss: SIGTERM after the grace, SIGKILL when ignored"

# ---- where it listens ----
# The job probes the launcher's port at loopback and at this host's
# external address: only the one it listens on answers.
external=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$')
probe_job='
  port=${TESSERA_LAUNCHER##*:}
  for address in "$@"; do
    if (exec 3<>"/dev/tcp/$address/$port") 2>/dev/null; then
      echo "probe: reached $address"
    else
      echo "probe: refused at $address"
    fi
  done'
if [ -z "$external" ] || [ "${external#127.}" != "$external" ]; then
  echo "check_launch: no external IPv4 address here: only the loopback listen is checked"
  "$launch" -- bash -c "$probe_job" probe 127.0.0.1 >"$log" 2>&1 || { cat "$log" >&2; fail "the probe job failed"; }
  says "loopback" "lifelines at 127\.0\.0\.1:" "probe: reached 127\.0\.0\.1"
else
  "$launch" -- bash -c "$probe_job" probe 127.0.0.1 "$external" >"$log" 2>&1 || { cat "$log" >&2; fail "the probe job failed"; }
  says "loopback" "lifelines at 127\.0\.0\.1:" "probe: reached 127\.0\.0\.1" "probe: refused at $external"
  "$launch" --address "$external" -- bash -c "$probe_job" probe 127.0.0.1 "$external" >"$log" 2>&1 ||
    { cat "$log" >&2; fail "the probe job failed"; }
  says "--address" "lifelines at $external:" "probe: reached $external" "probe: refused at 127\.0\.0\.1"
  echo "check_launch: a job on this host: the launcher listens on loopback only; --address $external: there only"
fi

# ---- a stranger who knows the port but not the secret ----
rm -f "$flag" "$flag".*
start_launcher -- bash -c "$one_rank_job" one-rank "$flag"
port=$(launcher_port)
wait_for_file "$flag.hello" "the rank's hello"
# The issue's lines, another job's secret, and no hello at all.
for lines in 'hello 5 8 4242 x\nfailed the job is over\n' 'hello another-jobs-secret-00000 0 1 4242 x\nfailed x\n' \
             'failed rank 0 is dead\n'; do
  exec 5<>"/dev/tcp/127.0.0.1/$port" || fail "strangers: cannot connect to the launcher at port $port"
  printf "$lines" >&5
  exec 5>&-
done
for _ in $(seq 600); do grep -q "did not present the job secret" "$log" && break; sleep 0.1; done
: >"$flag"
status=0
wait $launcher || status=$?
[ $status -eq 0 ] || { cat "$log" >&2; fail "a job with strangers at its launcher's port: exit $status, not 0"; }
says "strangers" "tessera launch: fake-host: rank 0 done" \
  "tessera launch: a connection from 127\.0\.0\.1:[0-9]+ did not present the job secret: closed, nothing taken from it" \
  "tessera launch: connections closed without the job secret: [1-3]$"
[ "$(grep -c "did not present the job secret" "$log")" -eq 1 ] || { cat "$log" >&2; fail "strangers: not one line for them"; }
# What a rank's failure or loss would have said (the command, printed, holds "failed" itself).
rank_trouble="first failure|rank [0-9]+ on .* (failed|lost) [0-9.]+ s in"
grep -qE "$rank_trouble" "$log" && { cat "$log" >&2; fail "strangers changed the job's outcome"; }
echo "check_launch: strangers without the secret: exit 0, one log line, nothing taken from them"

# ---- hellos from the job's own processes that do not fit it ----
rm -f "$flag" "$flag".*
: >"$flag"
status=0
"$launch" -- bash -c "$one_rank_job" one-rank "$flag" misfits >"$log" 2>&1 || status=$?
[ $status -eq 0 ] || { cat "$log" >&2; fail "a job with misfit hellos: exit $status, not 0"; }
says "misfits" "says the world has 2147483647 ranks; a job has 1 to 65536" "did not present the job secret" \
  "rank 0 said hello twice" "tessera launch: fake-host: rank 0 done" "tessera launch: hellos refused: 2"
grep -qE "$rank_trouble|bad_alloc" "$log" && { cat "$log" >&2; fail "misfit hellos changed the job's outcome"; }
lines=$(grep -c "^tessera launch:" "$log")
[ "$lines" -lt 12 ] || { cat "$log" >&2; fail "misfit hellos: $lines lines from the launcher"; }
echo "check_launch: an absurd world size and a rank twice: refused, the summary small, exit 0"

# ---- a flood of idle connections, with descriptors for fewer than the bound ----
# The launcher may hold 64 connections before their hellos; with 64
# descriptors in all its accepts fail (EMFILE) before that. 300 connections
# wait: it must say so once and not spin.
rm -f "$flag" "$flag".*
: >"$log"  # as start_launcher does
(ulimit -Sn 64 && exec "$launch" -- bash -c "$one_rank_job" one-rank "$flag") >"$log" 2>&1 &
launcher=$!
port=$(launcher_port)
wait_for_file "$flag.hello" "the rank's hello"
( for _ in $(seq 300); do exec {fd}<>"/dev/tcp/127.0.0.1/$port" || exit 1; done; : >"$flag.flooded"; exec sleep 600 ) &
flooder=$!
wait_for_file "$flag.flooded" "the flood"
ticks_before=$(awk '{print $14 + $15}' "/proc/$launcher/stat")
sleep 3
ticks=$(($(awk '{print $14 + $15}' "/proc/$launcher/stat") - ticks_before))
kill $flooder
wait $flooder 2>/dev/null
: >"$flag"
status=0
wait $launcher || status=$?
[ $status -eq 0 ] || { cat "$log" >&2; fail "a job with a flood at its launcher's port: exit $status, not 0"; }
says "flood" "cannot accept a lifeline: Too many open files \(holding [0-9]+ connections\); not accepting for 1 s" \
  "accepts that failed: [0-9]+"
[ "$(grep -c "cannot accept a lifeline" "$log")" -eq 1 ] || { cat "$log" >&2; fail "flood: not one line for the failed accepts"; }
lines=$(grep -c "^tessera launch:" "$log")
[ "$lines" -lt 12 ] || { cat "$log" >&2; fail "flood: $lines lines from the launcher"; }
# Clock ticks are 1/100 s. A launcher that waits uses next to none; one
# that spun used over 100 here with both cores busy, more on an idle machine.
[ "$ticks" -lt 30 ] || fail "flood: the launcher used $ticks ticks of CPU in 3 s"
echo "check_launch: 300 idle connections with 64 descriptors: exit 0, $lines lines from the launcher, $ticks ticks of CPU in 3 s"

# ---- usage ----
status=0
"$launch" >"$log" 2>&1 || status=$?
[ $status -eq 2 ] || { cat "$log" >&2; fail "launch without a command: exit $status, not 2 (a usage error)"; }
says "usage" "command is required"
for arguments in "--port nope -- true" "--port 70000 -- true" "--no-such-flag -- true" "--grace-s -1 -- true" \
                 "--heartbeat-timeout-s 1e300 -- true" "--heartbeat-timeout-s nan -- true" \
                 "--address 192.0.2.7 -- true"; do
  status=0
  # shellcheck disable=SC2086
  "$launch" $arguments >"$log" 2>&1 || status=$?
  [ $status -eq 2 ] || { cat "$log" >&2; fail "launch $arguments: exit $status, not 2 (a usage error)"; }
done
says "usage" "tessera launch: dist::tcp: cannot listen on 192\.0\.2\.7:0: "  # TEST-NET-1: never this host's
"$launch" --help >"$log" 2>&1 || fail "launch --help did not exit 0"
echo "check_launch: usage errors exit 2, --help 0"
