// One GPT-2 124M training step on the CPU (forward + backward + AdamW, B=4,
// T=64, vocab 50257, synthetic tokens): time per step, achieved GFLOP/s next to
// a direct Eigen SGEMM at GPT-2's shapes in the same run, and peak memory split
// into parameters, gradients, Adam moments and the rest.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/machine_context.h"
#include "tensor/gemm_backend.h"
#include "tensor/parallel.h"
#include "tensor/storage.h"
#include "train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// GFLOP/s of C = A B with A: [m, k], B: [k, n] row-major like tessera's
// tensors (2 m k n FLOPs), best of `repeats`.
double eigen_sgemm_gflops(int64_t m, int64_t k, int64_t n, int repeats) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMatrix a = RowMatrix::Random(m, k);
  RowMatrix b = RowMatrix::Random(k, n);
  RowMatrix c(m, n);
  c.noalias() = a * b;  // warm-up: pages touched, threads started
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = Clock::now();
    c.noalias() = a * b;
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * static_cast<double>(m * k * n) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  int64_t timed_steps = 5;
  CLI::App app{"GPT-2 124M training step (forward + backward + AdamW) on the CPU", "train_step"};
  app.add_option("--threads", threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 4096));
  app.add_option("--steps", timed_steps, "Timed steps after one warm-up step")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tessera::set_num_threads(threads);

  tessera::train::TrainConfig config;
  config.preset = "gpt2-124m";
  config.model = tessera::nn::GPTConfig::preset("gpt2-124m");
  config.seq_len = 64;
  config.batch = 4;
  config.grad_accum = 1;
  config.steps = timed_steps + 1;
  config.lr = 6e-4;
  config.warmup = 0;
  config.data = tessera::train::kSyntheticData;
  config.eval_every = 0;

  const auto& model_config = config.model;
  const int64_t params = model_config.num_parameters();
  const int64_t tokens = config.tokens_per_step();
  const double flops_per_token = model_config.flops_per_token(config.seq_len);
  fmt::print("train_step: GPT-2 124M ({} parameters), B={} T={} vocab {}, synthetic tokens, AdamW, clip {}\n", params,
             config.batch, config.seq_len, model_config.vocab_size, config.clip);
  fmt::print("machine: {}, vector ISA {}, GEMM {}, {} threads used of {}, load average {}\n", bench::cpu_model(),
             bench::vector_isa(), tessera::gemm_description(), tessera::num_threads(),
             std::thread::hardware_concurrency(), bench::load_average());

  tessera::train::Trainer trainer(config, tessera::train::build_data(config));
  const int64_t param_bytes = params * 4;

  // Warm-up: first-touch of parameters, gradients and Adam moments.
  const auto warmup_start = Clock::now();
  trainer.train_step();
  const double warmup_ms = seconds_since(warmup_start) * 1e3;

  // Activations: what one forward keeps alive for backward.
  trainer.optimizer().zero_grad();
  int64_t activation_bytes = 0;
  {
    const tessera::train::Batch batch = trainer.data().train_batch(0);
    const int64_t before = tessera::memory_stats(tessera::kCPU).live_bytes;
    tessera::Tensor loss = trainer.model().loss(batch.inputs, batch.targets);
    activation_bytes = tessera::memory_stats(tessera::kCPU).live_bytes - before;
  }

  tessera::reset_peak_memory(tessera::kCPU);
  std::vector<double> step_ms;
  for (int64_t step = 0; step < timed_steps; ++step) {
    tessera::train::StepMetrics metrics = trainer.train_step();
    step_ms.push_back(metrics.step_ms);
    fmt::print("  step {}: {:.1f} ms, loss {:.4f}\n", step + 1, metrics.step_ms, metrics.loss);
  }
  const int64_t peak = tessera::memory_stats(tessera::kCPU).peak_bytes;
  std::sort(step_ms.begin(), step_ms.end());
  const double median_ms = step_ms[step_ms.size() / 2];
  const double achieved = flops_per_token * static_cast<double>(tokens) / (median_ms / 1e3) / 1e9;

  const double gemm_fc = eigen_sgemm_gflops(tokens, model_config.n_embd, 4 * model_config.n_embd, 5);
  const double gemm_head = eigen_sgemm_gflops(tokens, model_config.n_embd, model_config.vocab_size, 3);

  fmt::print("\ntime        warm-up step {:.1f} ms; median of {} steps {:.1f} ms (min {:.1f}, max {:.1f}); "
             "{:.0f} tokens/s\n",
             warmup_ms, timed_steps, median_ms, step_ms.front(), step_ms.back(),
             static_cast<double>(tokens) / (median_ms / 1e3));
  fmt::print("flops       per token 6*N + 12*L*T*C = 6*{} + 12*{}*{}*{} = {:.3f} GFLOP (N without wpe); "
             "per step {:.1f} GFLOP\n",
             params - model_config.block_size * model_config.n_embd, model_config.n_layer, config.seq_len,
             model_config.n_embd, flops_per_token / 1e9, flops_per_token * static_cast<double>(tokens) / 1e9);
  fmt::print("achieved    {:.1f} GFLOP/s\n", achieved);
  fmt::print("eigen sgemm [{}x{}]x[{}x{}] {:.1f} GFLOP/s; lm head [{}x{}]x[{}x{}] {:.1f} GFLOP/s\n", tokens,
             model_config.n_embd, model_config.n_embd, 4 * model_config.n_embd, gemm_fc, tokens, model_config.n_embd,
             model_config.n_embd, model_config.vocab_size, gemm_head);
  fmt::print("ratio       train step / sgemm: {:.2f} (mlp shape), {:.2f} (lm head shape)\n", achieved / gemm_fc,
             achieved / gemm_head);

  const int64_t rest = peak - 4 * param_bytes;
  const int64_t limit = param_bytes * 4 * 5 / 4 + activation_bytes;  // 1.25 x params x 16 bytes + activations
  fmt::print("\nmemory      peak {:.1f} MiB (tessera CPU allocator, timed steps)\n", mib(peak));
  fmt::print("  parameters  {:8.1f} MiB  (N x 4 bytes)\n", mib(param_bytes));
  fmt::print("  gradients   {:8.1f} MiB  (N x 4 bytes)\n", mib(param_bytes));
  fmt::print("  adam m, v   {:8.1f} MiB  (N x 8 bytes)\n", mib(2 * param_bytes));
  fmt::print("  rest        {:8.1f} MiB  (activations + workspace; one forward keeps {:.1f} MiB for backward)\n",
             mib(rest), mib(activation_bytes));
  fmt::print("  limit       {:8.1f} MiB  (1.25 x N x 16 bytes + activations): peak is {} ({:.2f} x limit)\n",
             mib(limit), peak <= limit ? "within" : "OVER", static_cast<double>(peak) / static_cast<double>(limit));
  fmt::print("  cached      {:8.1f} MiB  (freed blocks the CPU allocator keeps for the next step)\n",
             mib(tessera::memory_stats(tessera::kCPU).cached_bytes));
  fmt::print("  process rss {:8.1f} MiB  (VmHWM: tensors, cache, Eigen's GEMM buffers, code)\n",
             mib(tessera::train::process_peak_rss_bytes()));
  return 0;
}
