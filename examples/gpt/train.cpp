// `train`: trains a GPT-2 style model, or a Llama with --model llama, with
// FSDP on --nproc ranks (threads of this process, or one process per rank
// under mpirun with --backend mpi). `train --nproc 4` has the tiny preset
// learn byte-level text from the Debian corpus in about a minute. Flags:
// train --help; the library behind it: train/training_run.h. Exit
// status: 0 trained (or --plan printed), 1 failed after it started, 2 usage
// error (a bad flag, clashing files, resources this machine lacks: nothing
// was written), 75 stopped by SIGINT/SIGTERM/SIGHUP/SIGUSR1 after saving
// (graceful_stop.h), 130 a second SIGINT during the stop, 128 + N killed by
// signal N.
#include <exception>
#include <unistd.h>

#include <iostream>

#include "train/flag_checks.h"
#include "train/graceful_stop.h"
#include "train/progress_output.h"
#include "train/train_config.h"
#include "train/training_run.h"

int main(int argc, char** argv) {
  tessera::train::TrainConfig config;
  if (auto exit_code = tessera::train::parse_command_line(argc, argv, config, std::cout, std::cerr)) return *exit_code;
  std::cout.flush();
  // The run's lines go out through a thread of their own: a reader that
  // stops reading (mpirun once signalled) must not stall a step or a save.
  // Closing it waits for every line, or a grace period after a stop signal:
  // the handlers stay installed until it has closed.
  const tessera::train::GracefulStop graceful_stop;
  tessera::train::ProgressOutput progress(STDOUT_FILENO);
  try {
    const tessera::train::TrainSummary summary = tessera::train::train(config, progress.stream());
    progress.close();
    if (summary.stop_signal != 0) return tessera::train::kStoppedExitCode;
  } catch (const tessera::train::UsageError& error) {
    progress.close();  // the lines before the error come before it
    std::cerr << "train: error: " << error.what() << "\nRun with --help for more information.\n";
    return tessera::train::kUsageExitCode;
  } catch (const std::exception& error) {
    progress.close();
    std::cerr << "train: error: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
