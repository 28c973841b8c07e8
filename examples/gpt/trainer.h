// The GPT example's training loop, in the order the FSDP2 recipe reads:
// build_model (on meta, then materialise and initialise), build_optimizer
// (AdamW, decay on matmul and embedding weights only), train_step (gradient
// accumulation, clipping, warmup + cosine lr), evaluate.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "examples/gpt/data_loader.h"
#include "examples/gpt/metrics.h"
#include "examples/gpt/train_config.h"
#include "nn/gpt.h"
#include "nn/optim/adamw.h"
#include "nn/optim/schedule.h"

namespace gpt {

// The data the config names: "" = the default corpus, "synthetic" = tokens
// below the model's vocab, else a text or llm.c token file. Throws
// tessera::Error when the model's vocab is too small for the data's tokens.
DataLoader build_data(const TrainConfig& config);

// GPT built on meta, then allocated on the CPU and initialised from
// config.seed: the bits depend only on the seed and each parameter's name.
std::unique_ptr<tessera::nn::GPT> build_model(const TrainConfig& config);

// AdamW with two groups (optim::weight_decay_groups): dim >= 2 tensors (matmul
// and embedding weights, GPT-2's convention) decay; biases and norm weights do not.
std::unique_ptr<tessera::optim::AdamW> build_optimizer(tessera::nn::GPT& model, const TrainConfig& config);

class Trainer {
 public:
  Trainer(TrainConfig config, DataLoader data);

  // One optimizer step over config.grad_accum micro-batches: each micro-batch's
  // loss is scaled by 1/grad_accum before backward so the gradients add up to
  // the mean; then clip (unless 0), set the step's lr, AdamW. The metrics carry
  // the mean unscaled loss and the grad norm before clipping.
  StepMetrics train_step();
  // Mean loss over config.eval_batches validation micro-batches, without the graph.
  double evaluate();

  int64_t steps_done() const { return step_; }
  const TrainConfig& config() const { return config_; }
  const DataLoader& data() const { return data_; }
  tessera::nn::GPT& model() { return *model_; }
  tessera::optim::AdamW& optimizer() { return *optimizer_; }

 private:
  TrainConfig config_;
  DataLoader data_;
  std::unique_ptr<tessera::nn::GPT> model_;
  std::unique_ptr<tessera::optim::AdamW> optimizer_;
  tessera::optim::WarmupCosineSchedule schedule_;
  std::vector<std::shared_ptr<tessera::nn::Parameter>> parameters_;
  int64_t step_ = 0;
};

struct TrainSummary {
  double unigram_entropy = 0.0;  // nats: what a model without context reaches
  std::vector<double> losses;   // per optimizer step
  std::optional<double> val_loss;  // the last evaluation
  double seconds = 0.0;
};

// The whole run: sets the thread count, loads the data, trains
// config.steps steps, prints the set-up and a progress line per step to `out`
// and, with config.log_json, one JSON object per step to that file.
TrainSummary train(const TrainConfig& config, std::ostream& out);

}  // namespace gpt
