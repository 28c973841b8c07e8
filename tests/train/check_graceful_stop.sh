#!/usr/bin/env bash
# `train` as a scheduler stops it: SIGTERM mid-run finishes the step in
# progress, commits a checkpoint, says so and exits 75; `--resume
# --deterministic` then continues with bitwise the losses of an uninterrupted
# run. A closed terminal (SIGHUP) stops it the same way. A second SIGTERM
# exits at once (143) and leaves a root that resumes.
# Usage: check_graceful_stop.sh path/to/train
set -euo pipefail
train=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "graceful stop: $*"; exit 1; }
common=(--data synthetic --warmup 10 --eval-every 0 --nproc 2 --deterministic --threads 1)
nano=(--preset nano --batch 8 --seq-len 32 --steps 300)
wider=(--preset tiny --batch 64 --seq-len 64 --steps 30)  # steps long enough to send a second signal within one

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
grep -qF "train: SIGTERM: stopping after the current micro-batch, saving the last finished step (send it again to exit at once)" "$work/stopped.out" ||
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

# The terminal or ssh session closes: SIGHUP saves and stops like SIGTERM.
start_run hangup "${nano[@]}"
kill -HUP "$pid"
status=0
wait "$pid" || status=$?
[ "$status" -eq 75 ] || { cat "$work/hangup.out"; fail "exit status $status after SIGHUP, expected 75"; }
hangup_steps=$(wc -l <"$work/hangup.jsonl")
grep -qF "stopped  on SIGHUP after step $hangup_steps of 300: $(printf '%s/hangup/step-%08d' "$work" "$hangup_steps") committed" \
  "$work/hangup.out" || { cat "$work/hangup.out"; fail "no stop line after SIGHUP"; }

# Signals sent back to back merge into one while pending, so the second goes
# once the first has been handled; steps of a wider model leave time for it.
start_run killed "${wider[@]}"
kill -TERM "$pid"
for _ in $(seq 1 2000); do
  grep -qF "stopping after the current micro-batch" "$work/killed.out" && break
  sleep 0.002
done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[ "$status" -eq 143 ] || { cat "$work/killed.out"; fail "exit status $status after two signals, expected 143"; }
grep -qF "train: second SIGTERM: exiting now" "$work/killed.out" || { cat "$work/killed.out"; fail "no message"; }
"$train" "${common[@]}" "${wider[@]}" --ckpt-dir "$work/killed" --resume >"$work/killed-resume.out" ||
  { cat "$work/killed-resume.out"; fail "the root of the killed run does not resume"; }
grep -qF "done     30 steps" "$work/killed-resume.out" || { cat "$work/killed-resume.out"; fail "the resume did not finish"; }
echo "graceful stop: stopped after step $last (exit 75), resumed bitwise; SIGHUP saves and stops too; two signals exit 143 and the root resumes"
