#!/usr/bin/env bash
# `train` as a scheduler stops it: SIGTERM mid-run finishes the step in
# progress, commits a checkpoint, says so and exits 75; `--resume
# --deterministic` then continues with bitwise the losses of an uninterrupted
# run. A closed terminal (SIGHUP) and SIGUSR1 (what mpirun and srun pass on
# at once) stop it the same way. A repeated SIGTERM changes nothing (the run
# still saves and exits 75); a SIGINT during the stop exits at once (130) and
# leaves a root that resumes.
# Usage: check_graceful_stop.sh path/to/train
set -euo pipefail
train=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "graceful stop: $*"; exit 1; }
common=(--data synthetic --warmup 10 --eval-every 0 --nproc 2 --deterministic --threads 1)
nano=(--preset nano --batch 8 --seq-len 32 --steps 300)
wider=(--preset tiny --batch 64 --seq-len 64 --steps 30)  # steps long enough to send another signal within one

# The losses of a JSON-lines log, one per line, as written (17 significant digits).
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"; }

# Starts a run into $work/$1 (logging to $work/$1.jsonl; more flags after
# the name) and waits until it has logged 3 steps.
start_run() {
  "$train" "${common[@]}" --ckpt-dir "$work/$1" --log-json "$work/$1.jsonl" "${@:2}" >"$work/$1.out" 2>&1 &
  pid=$!
  for _ in $(seq 1 2000); do
    [ -f "$work/$1.jsonl" ] && [ "$(wc -l <"$work/$1.jsonl")" -ge 3 ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  cat "$work/$1.out"
  fail "the run did not log 3 steps"
}

"$train" "${common[@]}" "${nano[@]}" --log-json "$work/whole.jsonl" >/dev/null

start_run stopped "${nano[@]}"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[ "$status" -eq 75 ] || { cat "$work/stopped.out"; fail "exit status $status, expected 75"; }
last=$(wc -l <"$work/stopped.jsonl")
[ "$last" -lt 300 ] || fail "the run finished before the signal arrived; the test proves nothing"
checkpoint=$(printf '%s/stopped/step-%08d' "$work" "$last")
grep -qF "train: SIGTERM: stopping after the current micro-batch, saving the last finished step (SIGINT, Ctrl-C, exits at once)" "$work/stopped.out" ||
  { cat "$work/stopped.out"; fail "no message on the signal"; }
grep -qF "stopped  on SIGTERM after step $last of 300: $checkpoint committed; continue with --resume" \
  "$work/stopped.out" || { cat "$work/stopped.out"; fail "no stop line naming the checkpoint of step $last"; }
[ -f "$checkpoint/metadata.json" ] || fail "$checkpoint was not committed"

"$train" "${common[@]}" "${nano[@]}" --ckpt-dir "$work/stopped" --resume --log-json "$work/resumed.jsonl" >"$work/resumed.out"
grep -qF "resume   from $checkpoint (step $last)" "$work/resumed.out" || { cat "$work/resumed.out"; fail "no resume line"; }
if ! diff <(losses "$work/whole.jsonl") <(cat <(losses "$work/stopped.jsonl") <(losses "$work/resumed.jsonl")) \
  >"$work/diff"; then
  head "$work/diff"
  fail "the stopped and resumed losses differ from the uninterrupted run's"
fi

# The terminal or ssh session closes: SIGHUP saves and stops like SIGTERM;
# so does SIGUSR1.
for signal in HUP USR1; do
  start_run "$signal" "${nano[@]}"
  kill -"$signal" "$pid"
  status=0
  wait "$pid" || status=$?
  [ "$status" -eq 75 ] || { cat "$work/$signal.out"; fail "exit status $status after SIG$signal, expected 75"; }
  steps=$(wc -l <"$work/$signal.jsonl")
  grep -qF "stopped  on SIG$signal after step $steps of 300: $(printf '%s/%s/step-%08d' "$work" "$signal" "$steps") committed" \
    "$work/$signal.out" || { cat "$work/$signal.out"; fail "no stop line after SIG$signal"; }
done

# Signals sent back to back merge into one while pending, so the next goes
# once the first has been handled; steps of a wider model leave time for it.
# send_during_stop NAME SIGNAL: SIGTERM to a run into $work/NAME, then SIGNAL
# while it stops; its exit status in $status.
send_during_stop() {
  start_run "$1" "${wider[@]}"
  kill -TERM "$pid"
  for _ in $(seq 1 2000); do
    grep -qF "stopping after the current micro-batch" "$work/$1.out" && break
    sleep 0.002
  done
  kill -"$2" "$pid"
  status=0
  wait "$pid" || status=$?
}

# A scheduler or launcher that repeats its SIGTERM does not cut the save short.
send_during_stop repeated TERM
[ "$status" -eq 75 ] || { cat "$work/repeated.out"; fail "exit status $status after two SIGTERMs, expected 75"; }
grep -qF "train: SIGTERM: already stopping (SIGINT exits at once)" "$work/repeated.out" ||
  { cat "$work/repeated.out"; fail "no message on the repeated SIGTERM"; }
grep -qF "committed; continue with --resume" "$work/repeated.out" || { cat "$work/repeated.out"; fail "no checkpoint"; }

# A person pressing Ctrl-C during the stop means now.
send_during_stop killed INT
[ "$status" -eq 130 ] || { cat "$work/killed.out"; fail "exit status $status after SIGINT during the stop, expected 130"; }
grep -qF "train: SIGINT while stopping: exiting now" "$work/killed.out" || { cat "$work/killed.out"; fail "no message"; }
"$train" "${common[@]}" "${wider[@]}" --ckpt-dir "$work/killed" --resume >"$work/killed-resume.out" ||
  { cat "$work/killed-resume.out"; fail "the root of the killed run does not resume"; }
grep -qF "done     30 steps" "$work/killed-resume.out" || { cat "$work/killed-resume.out"; fail "the resume did not finish"; }
echo "graceful stop: stopped after step $last (exit 75), resumed bitwise; SIGHUP and SIGUSR1 save and stop too; a repeated SIGTERM still saves; SIGINT during the stop exits 130 and the root resumes"
