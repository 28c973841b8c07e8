#!/usr/bin/env bash
# Preemption of a 2-rank `train --backend mpi` job on a loaded machine (a busy
# loop on every core, for the whole check): a SIGTERM to mpirun, to
# tools/launch, to one rank, or to all of them at once as a scheduler sends
# it, TRIES times each, must every time commit the last finished step, and
# `--resume` must end where an uninterrupted run ends, bitwise
# (deterministic mode).
#   - mpirun: started with --mca odls_base_sigkill_timeout 5, as
#     docs/training.md says (it advises 30). On SIGTERM, OpenMPI 4.1's mpirun
#     sends the ranks SIGCONT, then SIGTERM after that timeout and SIGKILL
#     after twice it (1 s by default: too short for a save on a busy
#     machine), and exits 1. It stops forwarding the ranks' output at once,
#     so rank 0 fills the pipe in those seconds: its lines go out through a
#     thread of their own (train/progress_output.h), or it would block in a
#     write and be killed unsaved. For the same reason its stop line may never
#     reach mpirun's output: the committed checkpoint of the last logged step
#     is the proof there.
#   - tools/launch: passes the stop on to the ranks itself; the job exits 75
#     and the launcher says every rank stopped.
#   - one rank: the ranks agree to stop after the same step; mpirun, with
#     its defaults, exits 75.
#   - everything (Slurm's scancel and preemption signal every process of a
#     job): tools/launch --stop-grace-s 8 inside a batch allocation, where it
#     raises mpirun's kill timeout to 4 s; SIGTERM to the launcher, mpirun
#     and both ranks together; the launcher exits 75. The allocation is
#     LSF's variable, which this OpenMPI (no LSF support) does not read.
# The resumes run as threads of one process (--nproc 2): deterministic mode
# gives them the bits of MPI ranks.
# Usage: check_preemption.sh path/to/train path/to/launch path/to/mpirun [TRIES]
set -uo pipefail
train=$1 launch=$2 mpirun=$3 tries=${4:-10}
fail() { echo "preemption: FAILED: $*" >&2; exit 1; }
[ -x "$mpirun" ] || { echo "preemption: no mpirun: skipped"; exit 77; }

work=$(mktemp -d)
loaders=()
cleanup() {
  [ ${#loaders[@]} -eq 0 ] || kill "${loaders[@]}" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  loaders+=($!)
done

mpirun_flags=(--allow-run-as-root --oversubscribe --bind-to none)
kill_timeout_s=5
common=(--preset tiny --batch 8 --seq-len 32 --data synthetic --deterministic --threads 1 --eval-every 0 --warmup 10)

# The losses of a JSON-lines log, one per line, as written (17 significant digits).
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"; }

# wait_for_job SECONDS: waits for $job, killing it after SECONDS; its exit status in $status.
wait_for_job() {
  local waited=0
  while kill -0 "$job" 2>/dev/null && [ $waited -lt $(($1 * 10)) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -0 "$job" 2>/dev/null && { kill -KILL "$job"; fail "$name: still running after $1 s"; }
  status=0
  wait "$job" || status=$?
}

# start_job MODE NAME STEPS: starts the job into $work/NAME in the background
# ($job), the way MODE signals it later, and waits until it has logged 3 steps.
start_job() {
  local mode=$1 steps=$3
  name=$2
  local run=("$train" --backend mpi "${common[@]}" --steps "$steps" --ckpt-dir "$work/$name"
    --log-json "$work/$name.jsonl")
  case $mode in  # exec: $job is mpirun's (or the launcher's) pid, not a subshell's
    mpirun) exec "$mpirun" "${mpirun_flags[@]}" --mca odls_base_sigkill_timeout $kill_timeout_s -np 2 "${run[@]}" ;;
    launch) exec "$launch" --stop-grace-s 30 -- "$mpirun" "${mpirun_flags[@]}" -np 2 "${run[@]}" ;;
    rank) exec "$mpirun" "${mpirun_flags[@]}" -np 2 "${run[@]}" ;;
    everything)
      LSB_MCPU_HOSTS="$(hostname) 2" exec "$launch" --stop-grace-s 8 -- "$mpirun" "${mpirun_flags[@]}" -np 2 "${run[@]}"
      ;;
  esac >"$work/$name.out" 2>&1 &
  job=$!
  for _ in $(seq 1 3000); do
    [ -f "$work/$name.jsonl" ] && [ "$(wc -l <"$work/$name.jsonl")" -ge 3 ] && return 0
    kill -0 "$job" 2>/dev/null || break
    sleep 0.02
  done
  cat "$work/$name.out" >&2
  fail "$name: the job did not log 3 steps"
}

# How many steps a second a loaded run makes (its "done" line), so that the
# steps mpirun's delay (its kill timeout) lets pass do not reach the end.
"$mpirun" "${mpirun_flags[@]}" -np 2 "$train" --backend mpi "${common[@]}" --steps 40 >"$work/measure.out" 2>&1 ||
  { cat "$work/measure.out" >&2; fail "a plain run failed"; }
measured_s=$(sed -nE 's/^done +40 steps in ([0-9.]+) s.*/\1/p' "$work/measure.out")
[ -n "$measured_s" ] || { cat "$work/measure.out" >&2; fail "no done line"; }
# Ten times the steps of the kill timeout and a second at the measured pace:
# step times under load vary tenfold (a rank waits for one whose core a busy
# loop holds, and other jobs come and go), and a run that ends before the
# stop proves nothing.
slow_steps=$(awk -v s="$measured_s" -v t=$kill_timeout_s 'BEGIN { n = int(3 + 10 * (t + 1) * 40 / s); print (n < 60 ? 60 : n) }')
fast_steps=80  # the launcher and a rank pass the stop on at once: it lands within a few steps

# The uninterrupted runs' last losses.
for steps in "$slow_steps" "$fast_steps"; do
  "$train" "${common[@]}" --nproc 2 --steps "$steps" --log-json "$work/whole-$steps.jsonl" >"$work/whole.out" 2>&1 ||
    { cat "$work/whole.out" >&2; fail "the uninterrupted run of $steps steps failed"; }
done

saved=0
# try MODE N: one preemption and its resume.
try() {
  local mode=$1 steps=$fast_steps expected_status=75
  [ "$mode" = mpirun ] && steps=$slow_steps expected_status=1
  start_job "$mode" "$mode-$2" "$steps"
  case $mode in
    mpirun | launch) kill -TERM "$job" ;;
    rank)
      local rank_pid
      rank_pid=$(pgrep -P "$job" -x train | tail -n 1)
      [ -n "$rank_pid" ] || fail "$name: no rank process under mpirun"
      kill -TERM "$rank_pid"
      ;;
    everything)
      local mpirun_pid rank_pids
      mpirun_pid=$(pgrep -P "$job" | head -n 1)
      rank_pids=$(pgrep -P "$mpirun_pid" -x train | tr '\n' ' ')
      [ -n "$mpirun_pid" ] && [ "$(wc -w <<<"$rank_pids")" -eq 2 ] || fail "$name: no mpirun and 2 ranks under the launcher"
      local mpirun_command
      mpirun_command=$(tr '\0' ' ' <"/proc/$mpirun_pid/cmdline")
      [[ $mpirun_command == *"--mca odls_base_sigkill_timeout 4 "* ]] ||
        fail "$name: mpirun was not given the kill timeout: $mpirun_command"
      # shellcheck disable=SC2086
      kill -TERM "$job" "$mpirun_pid" $rank_pids
      ;;
  esac
  wait_for_job 300
  local out="$work/$name.out"
  [ "$status" -eq "$expected_status" ] || { cat "$out" >&2; fail "$name: exit status $status, expected $expected_status"; }
  local last
  last=$(wc -l <"$work/$name.jsonl")
  [ "$last" -lt "$steps" ] || fail "$name: the run finished before the stop; the try proves nothing"
  local checkpoint
  checkpoint=$(printf '%s/%s/step-%08d' "$work" "$name" "$last")
  local stop_line="stopped  on SIGTERM after step $last of $steps: $checkpoint committed; continue with --resume"
  if [ "$mode" = mpirun ]; then  # mpirun forwards nothing once signalled; a stop line it did pass must be right
    grep -q "^stopped " "$out" && ! grep -qF "$stop_line" "$out" &&
      { cat "$out" >&2; fail "$name: a stop line that does not name the checkpoint of step $last"; }
  else
    grep -qF "$stop_line" "$out" || { cat "$out" >&2; fail "$name: no stop line naming the checkpoint of step $last"; }
  fi
  [ -f "$checkpoint/metadata.json" ] || { cat "$out" >&2; fail "$name: $checkpoint was not committed"; }
  if [ "$mode" = launch ] || [ "$mode" = everything ]; then
    grep -qF "tessera launch: the job stopped on request: every rank ended its graceful stop" "$out" &&
      grep -qE "tessera launch: [^ ]+: rank 0 stopped, rank 1 stopped$" "$out" ||
      { cat "$out" >&2; fail "$name: the launcher does not report a stop"; }
    grep -qE "first failure|lost" "$out" && { cat "$out" >&2; fail "$name: the launcher reports a failure"; }
  fi
  "$train" "${common[@]}" --nproc 2 --steps "$steps" --ckpt-dir "$work/$name" --resume \
    --log-json "$work/$name-resumed.jsonl" >"$work/$name-resumed.out" 2>&1 ||
    { cat "$work/$name-resumed.out" >&2; fail "$name: the resume failed"; }
  local resumed whole
  resumed=$(losses "$work/$name-resumed.jsonl" | tail -n 1)
  whole=$(losses "$work/whole-$steps.jsonl" | tail -n 1)
  [ "$resumed" = "$whole" ] || fail "$name: stopped after step $last, the resumed run ends at loss $resumed, not $whole"
  saved=$((saved + 1))
  echo "preemption: $name: stopped after step $last of $steps (exit $status), saved, resumed to loss $resumed"
  rm -rf "${work:?}/$name"
}

for mode in mpirun launch rank everything; do
  for i in $(seq "$tries"); do try "$mode" "$i"; done
done
echo "preemption: $saved of $((4 * tries)) tries saved and resumed bitwise under load (40 steps took $measured_s s; $slow_steps steps under mpirun)"
