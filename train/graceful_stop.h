// Graceful stop: what a cluster scheduler's SIGTERM, a user's Ctrl-C (SIGINT)
// or a closed terminal or ssh session (SIGHUP) means to `train`. The first
// signal only sets a flag: the run finishes the micro-batch it is in, the
// ranks agree on the stop (the largest flag travels in an all-reduce after
// every micro-batch and in the step's metrics), a step cut short is dropped
// whole, a checkpoint of the last finished step is written when --ckpt-dir
// is set, and the process exits with kStoppedExitCode. A second signal exits
// at once with 128 + the signal number, the shell's convention for "killed";
// a checkpoint commit is atomic, so that never tears one. While installed,
// SIGPIPE is ignored: a pipe whose reader died with the terminal (`train |
// tee log`) makes writes fail instead of killing the run before its save.
#pragma once

namespace tessera::train {

// EX_TEMPFAIL of sysexits.h: "try again later". Job scripts requeue on it
// (`train ... --resume` continues), and it differs from success (0), a failed
// run (1), bad flags (2) and death by a signal (128 + N).
inline constexpr int kStoppedExitCode = 75;

// Installs the handlers for SIGINT, SIGTERM and SIGHUP (and ignores SIGPIPE)
// for its lifetime, then puts the previous ones back. One at a time per process.
class GracefulStop {
 public:
  GracefulStop();
  ~GracefulStop();
  GracefulStop(const GracefulStop&) = delete;
  GracefulStop& operator=(const GracefulStop&) = delete;

  // The first signal received while installed, or 0 (also once uninstalled).
  static int requested();
};

// "SIGINT", "SIGTERM", "SIGHUP", or "a signal".
const char* signal_name(int signal);

}  // namespace tessera::train
