#!/usr/bin/env bash
# tools/launch around jobs on this machine (the multi-host check runs it
# across hosts): what it says and how it ends the job.
#   - a clean MPI job: exit 0, every rank done, each named with its host;
#   - a rank that fails: the launcher names it and its error as the first failure;
#   - a job that does not end after a rank was lost: SIGTERM to its process
#     group after --grace-s, SIGKILL 5 s later when SIGTERM is ignored;
#   - no command: a usage error.
# The ranks of the last two are bash processes speaking the lifeline
# protocol (dist/launch/lifeline.h) through /dev/tcp, so that they can misbehave.
# Usage: check_launch.sh path/to/launch path/to/test_dist_mpi MPIRUN MPIRUN-FLAGS...
set -uo pipefail
launch=$1 test_dist_mpi=$2
shift 2
mpirun=("$@")
fail() { echo "check_launch: FAILED: $*" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
says() {  # CASE PATTERN...: the log holds each extended regular expression
  local case=$1
  shift
  for pattern in "$@"; do
    grep -qE -- "$pattern" "$log" || { cat "$log" >&2; fail "$case: the log does not say /$pattern/"; }
  done
}
host=$(hostname)

# ---- a clean job ----
"$launch" -- "${mpirun[@]}" -np 2 "$test_dist_mpi" >"$log" 2>&1 || { cat "$log" >&2; fail "a clean job failed"; }
says "clean job" "tessera launch: mpirun exited 0 after" "tessera launch: $host: rank 0 done, rank 1 done"
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
  ( exec 3<>"/dev/tcp/$address/$port"; echo "hello 0 2 $BASHPID fake-host" >&3; kill -9 $BASHPID ) &
  exec 4<>"/dev/tcp/$address/$port"
  echo "hello 1 2 $$ fake-host" >&4
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

# ---- usage ----
status=0
"$launch" >"$log" 2>&1 || status=$?
[ $status -ne 0 ] || fail "launch without a command exited 0"
says "usage" "command is required"
echo "check_launch: no command: exit $status, a usage error"
