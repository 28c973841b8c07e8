// train's loss curve as a picture (--loss-plot PATH): the train loss of every
// step and the validation loss at each evaluation, against the unigram
// entropy (what a model that ignores context reaches), drawn by
// train/svg_chart.h as SVG at the end of the run. Its file follows the rules of
// --trace (run_files.h): settled before the first step, an earlier launch's
// refused without --overwrite, and a --resume draws beside it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/output_claim.h"
#include "train/svg_chart.h"
#include "train/train_config.h"

namespace tessera::train {

struct LossHistory {
  int64_t first_step = 1;                            // the step of losses[0]
  std::vector<double> losses;                        // train loss, one per step from first_step
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss) of each evaluation
  double unigram_entropy = 0.0;                      // nats per token
};

// The chart of `history`, titled `title`: series "train loss", "validation
// loss" (when there was an evaluation) and "unigram entropy" (a flat line).
charts::LineChart loss_chart(const LossHistory& history, const std::string& title);

// Where this launch draws the plot ("" = config.loss_plot unset): checked
// like every output before the first step (not an input or another output,
// a regular file's path in a writable directory, no earlier launch's file
// unless --overwrite); a --resume whose plot exists draws
// PATH.from-step-N.svg beside it. Reads only. Throws tessera::Error.
std::string settle_loss_plot(const TrainConfig& config);

// Draws `history` to the output `plot` claimed at the start (its temporary
// PATH.partial, published as PATH: output_claim.h).
void write_loss_plot(const OutputClaim& plot, const LossHistory& history, const std::string& title);

}  // namespace tessera::train
