// `train`'s whole run, around the Trainer: the checks before the first step,
// the progress log, checkpoints, evaluation, the graceful stop, the export.
// Everything a run can know it will fail on is found before the first step:
// its resources (check_train_resources), every file it will write (proven
// creatable on the rank that writes it), and its checkpoint root (a fresh run
// needs one without checkpoints, a resume one of this run's identity).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include "train/train_config.h"

namespace tessera::train {

struct TrainSummary {
  double unigram_entropy = 0.0;  // nats: what a model without context reaches
  int64_t first_step = 1;       // 1, or the step after the checkpoint a --resume started from
  std::vector<double> losses;   // per optimizer step from first_step
  std::optional<double> val_loss;  // the last evaluation
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss) of every evaluation
  double seconds = 0.0;
  int stop_signal = 0;  // the signal that ended the run early (GracefulStop), on every rank; 0: it ran to the end
};

// Loads the data, starts the ranks (init_distributed), builds the sharded
// model and trains config.steps steps. Rank 0 prints the set-up and a
// progress line per step to `out` and, with config.log_json, writes one JSON
// object per step to that file; with config.trace every rank's events are
// written at the end. With config.plan it prints the sharding plan instead of
// training (run_plan.h), refusing no model for its size. A --resume takes
// its lr schedule, weight decay and clipping from the checkpoint and says
// which flags that overrides. Every save first proves the state finite
// (Trainer::require_finite_state). A stop signal (GracefulStop) ends
// the run after the step in progress, with a checkpoint when config.ckpt_dir
// is set, and no export. With config.loss_plot, rank 0 draws the loss curve
// at the end (loss_plot.h; a stopped run's too) and names the file in the
// log's last line. The summary's losses are rank 0's (under MPI, empty
// on the other ranks). What the checks before the start refuse (the flags,
// the machine's resources, the files: run_files.h, the data) is thrown as a
// UsageError (flag_checks.h), anything later as a tessera::Error.
TrainSummary train(const TrainConfig& config, std::ostream& out);

}  // namespace tessera::train
