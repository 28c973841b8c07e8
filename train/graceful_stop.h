// Graceful stop: what a cluster scheduler's SIGTERM, a user's Ctrl-C (SIGINT),
// a closed terminal or ssh session (SIGHUP) or a SIGUSR1 (which mpirun and
// srun pass on to every rank at once, and Slurm's --signal sends ahead of a
// time limit) means to `train`. The first signal only sets a flag: the run
// finishes the micro-batch it is in, the ranks agree on the stop (the
// largest flag travels in an all-reduce after every micro-batch and in the
// step's metrics), a step cut short is dropped whole, a checkpoint of the
// last finished step is written when --ckpt-dir is set, and the process
// exits with kStoppedExitCode.
// Only SIGINT, a person pressing Ctrl-C again, exits at once after that
// (130, the shell's "killed by SIGINT"); a checkpoint commit is atomic, so
// that never tears one. A repeated SIGTERM, SIGHUP or SIGUSR1 changes
// nothing: schedulers and launchers send them more than once (Slurm signals
// every process of a job and tools/launch passes its own on too; mpirun's
// teardown sends one more), and they follow with SIGKILL when they will not
// wait. While installed, SIGPIPE is ignored: a pipe whose reader died with
// the terminal (`train | tee log`) makes writes fail instead of killing the
// run before its save.
#pragma once

namespace tessera::train {

// EX_TEMPFAIL of sysexits.h: "try again later". Job scripts requeue on it
// (`train ... --resume` continues), and it differs from success (0), a failed
// run (1), bad flags (2) and death by a signal (128 + N).
inline constexpr int kStoppedExitCode = 75;

// Installs the handlers for SIGINT, SIGTERM, SIGHUP and SIGUSR1 (and ignores
// SIGPIPE) for its lifetime, then puts the previous ones back. One at a time
// per process.
class GracefulStop {
 public:
  GracefulStop();
  ~GracefulStop();
  GracefulStop(const GracefulStop&) = delete;
  GracefulStop& operator=(const GracefulStop&) = delete;

  // The first signal received while installed, or 0 (also once uninstalled).
  static int requested();
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", or "a signal".
const char* signal_name(int signal);

}  // namespace tessera::train
