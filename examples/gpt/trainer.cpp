// build_data, build_model, build_optimizer, the optimizer step and the run.
#include "examples/gpt/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/optim/clip_grad.h"
#include "tensor/parallel.h"

namespace gpt {

using tessera::Tensor;

DataLoader build_data(const TrainConfig& config) {
  const LoaderOptions options{.batch = config.batch, .seq_len = config.seq_len, .seed = config.seed};
  DataLoader loader = config.data == kSyntheticData
                          ? DataLoader::synthetic(config.model.vocab_size, options)
                          : DataLoader(config.data.empty() ? load_default_corpus() : load_token_file(config.data),
                                       options);
  TESSERA_CHECK(loader.token_range() <= config.model.vocab_size,
                "data: {} holds tokens up to {}, but the model's vocab is {}; pass --vocab {} or more",
                loader.description(), loader.token_range() - 1, config.model.vocab_size, loader.token_range());
  return loader;
}

std::unique_ptr<tessera::nn::GPT> build_model(const TrainConfig& config) {
  auto model = std::make_unique<tessera::nn::GPT>(config.model, tessera::kMeta);
  model->to_empty(tessera::kCPU);
  model->reset_parameters(config.seed);
  return model;
}

std::unique_ptr<tessera::optim::AdamW> build_optimizer(tessera::nn::GPT& model, const TrainConfig& config) {
  auto groups = tessera::optim::weight_decay_groups(model.named_parameters(), config.weight_decay);
  return std::make_unique<tessera::optim::AdamW>(std::move(groups),
                                                 tessera::optim::AdamWOptions{.lr = config.lr,
                                                                              .beta1 = 0.9,
                                                                              .beta2 = 0.95,
                                                                              .eps = 1e-8,
                                                                              .weight_decay = config.weight_decay});
}

Trainer::Trainer(TrainConfig config, DataLoader data)
    : config_(std::move(config)),
      data_(std::move(data)),
      model_(build_model(config_)),
      optimizer_(build_optimizer(*model_, config_)),
      schedule_(config_.lr, config_.lr * config_.min_lr_ratio, config_.warmup, config_.steps),
      parameters_(model_->parameters()) {
  TESSERA_CHECK(data_.options().batch == config_.batch && data_.options().seq_len == config_.seq_len,
                "Trainer: the data loader yields [{}, {}] batches, the config asks for [{}, {}]", data_.options().batch,
                data_.options().seq_len, config_.batch, config_.seq_len);
}

StepMetrics Trainer::train_step() {
  const auto start = std::chrono::steady_clock::now();
  const double lr = schedule_.lr(step_);
  optimizer_->set_lr(lr);
  optimizer_->zero_grad();

  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    Batch batch = data_.train_batch(global_micro_batch(step_, config_.grad_accum, micro));
    Tensor loss = model_->loss(batch.inputs, batch.targets);
    loss_sum += loss.item();
    // Scaled so that the accumulated gradient is that of the mean loss.
    tessera::autograd::backward(tessera::mul(loss, 1.0 / static_cast<double>(config_.grad_accum)));
  }
  const double max_norm = config_.clip > 0.0 ? config_.clip : std::numeric_limits<double>::infinity();
  const double grad_norm = tessera::optim::clip_grad_norm_(parameters_, max_norm);
  TESSERA_CHECK(std::isfinite(grad_norm), "train: the gradient norm is {} at step {} (loss {}); try a lower --lr",
                grad_norm, step_ + 1, loss_sum / static_cast<double>(config_.grad_accum));
  optimizer_->step();
  ++step_;

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens = static_cast<double>(config_.tokens_per_step());
  StepMetrics metrics;
  metrics.step = step_;
  metrics.loss = loss_sum / static_cast<double>(config_.grad_accum);
  metrics.lr = lr;
  metrics.grad_norm = grad_norm;
  metrics.step_ms = seconds * 1e3;
  metrics.tokens_per_s = tokens / seconds;
  metrics.gflops_per_s = config_.model.flops_per_token(config_.seq_len) * tokens / seconds / 1e9;
  metrics.peak_mem_bytes = tessera::memory_stats(tessera::kCPU).peak_bytes;
  metrics.peak_rss_bytes = process_peak_rss_bytes();
  return metrics;
}

double Trainer::evaluate() {
  tessera::autograd::NoGradGuard no_grad;
  model_->eval();
  double loss_sum = 0.0;
  for (int64_t index = 0; index < config_.eval_batches; ++index) {
    Batch batch = data_.val_batch(index);
    loss_sum += model_->loss(batch.inputs, batch.targets).item();
  }
  model_->train();
  return loss_sum / static_cast<double>(config_.eval_batches);
}

TrainSummary train(const TrainConfig& config, std::ostream& out) {
  config.validate();
  if (config.threads > 0) tessera::set_num_threads(config.threads);
  std::optional<JsonLinesWriter> log;
  if (!config.log_json.empty()) log.emplace(config.log_json);
  DataLoader data = build_data(config);

  TrainSummary summary;
  summary.unigram_entropy = data.unigram_entropy();
  out << describe(config) << '\n';
  out << fmt::format("data     {}\n         {} training and {} validation tokens\n", data.description(),
                     data.is_synthetic() ? std::string("unbounded") : std::to_string(data.train_tokens()),
                     data.is_synthetic() ? std::string("unbounded") : std::to_string(data.val_tokens()));
  out << fmt::format("threads  {}\n", tessera::num_threads());
  out << fmt::format("target   unigram entropy of the training data {:.4f} nats (a model that ignores context); "
                     "uniform guess ln({}) = {:.4f}\n",
                     summary.unigram_entropy, config.model.vocab_size,
                     std::log(static_cast<double>(config.model.vocab_size)));
  out.flush();

  const auto start = std::chrono::steady_clock::now();
  Trainer trainer(config, std::move(data));
  for (int64_t step = 1; step <= config.steps; ++step) {
    StepMetrics metrics = trainer.train_step();
    const bool eval_due = config.eval_every > 0 && (step % config.eval_every == 0 || step == config.steps);
    if (eval_due) {
      metrics.val_loss = trainer.evaluate();
      summary.val_loss = metrics.val_loss;
    }
    summary.losses.push_back(metrics.loss);
    out << format_progress(metrics) << '\n';
    out.flush();
    if (log) log->write(to_json(metrics));
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  out << fmt::format("done     {} steps in {:.1f} s: loss {:.4f} -> {:.4f}{}; unigram entropy {:.4f} nats\n",
                     config.steps, summary.seconds, summary.losses.front(), summary.losses.back(),
                     summary.val_loss ? fmt::format(" (val {:.4f})", *summary.val_loss) : std::string(),
                     summary.unigram_entropy);
  return summary;
}

}  // namespace gpt
