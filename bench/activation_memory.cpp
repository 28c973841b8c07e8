// Activation memory with and without activation checkpointing, and the step
// time the recompute costs: for each policy, what a model holds for backward
// once its forward is done (a rank's activations: FSDP shards parameters,
// never activations, so this is the per-rank figure at any world size), the
// peak of forward and backward (its first step), and the median time of
// forward + backward over --steps rounds that run one step of each policy.
// Beside each, the run plan's figure (train/activation_plan.h).
//   activation_memory [--model gpt|llama] [--preset P] [--batch B] [--seq T]
//                     [--device cpu|cuda] [--ac off,full,every:2,selective] [--steps N]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "autograd/engine.h"
#include "bench/machine_context.h"
#include "nn/activation_checkpoint.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"
#include "tensor/storage.h"
#include "tensor/stream.h"
#include "train/activation_plan.h"
#include "train/model_family.h"

namespace {

using Clock = std::chrono::steady_clock;
using tessera::nn::ActivationCheckpointPolicy;

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Measured {
  int64_t held_after_forward = 0;
  int64_t peak = 0;
  double median_seconds = 0;
};

tessera::Tensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t stream, tessera::Device device) {
  const tessera::Tensor uniform = tessera::ops::rand({batch, seq}, tessera::PhiloxKey{.seed = 3, .stream = stream});
  const tessera::Tensor ids = tessera::ops::to(tessera::ops::mul(uniform, static_cast<double>(vocab - 1)),
                                               tessera::DType::i64);
  return tessera::ops::to(ids, device);
}

// One policy's model and batch. Its first step measures memory; the timed
// steps of all policies run in rounds, one step each, so that a change in
// the machine's load falls on every policy alike.
class PolicyRun {
 public:
  PolicyRun(const tessera::train::ModelConfig& shape, const ActivationCheckpointPolicy& policy, int64_t batch,
            int64_t seq, tessera::Device device)
      : policy_(policy), device_(device) {
    tessera::manual_seed(1);
    model_ = tessera::train::build_model(shape, device);
    tessera::nn::apply_activation_checkpointing(model_->blocks(), policy);
    const int64_t vocab = tessera::train::vocab_size(shape);
    idx_ = random_tokens(batch, seq, vocab, 1, device);
    targets_ = random_tokens(batch, seq, vocab, 2, device);
    auto counters = std::make_shared<tessera::MemoryCounters>();
    step(counters);
    measured_.peak = counters->snapshot().peak_bytes;
  }

  const ActivationCheckpointPolicy& policy() const { return policy_; }
  void timed_step() {
    const auto start = Clock::now();
    step(nullptr);
    seconds_.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  Measured measured() const {
    Measured result = measured_;
    std::vector<double> sorted = seconds_;
    std::sort(sorted.begin(), sorted.end());
    result.median_seconds = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
    return result;
  }

 private:
  // Forward and backward; with `counters`, what forward holds is read there.
  void step(const std::shared_ptr<tessera::MemoryCounters>& counters) {
    for (const auto& parameter : model_->parameters()) parameter->tensor().set_grad(tessera::Tensor());
    std::optional<tessera::MemoryScope> scope;
    if (counters != nullptr) scope.emplace(counters);
    const tessera::Tensor loss = model_->loss(idx_, targets_);
    if (counters != nullptr) measured_.held_after_forward = counters->snapshot().live_bytes;
    tessera::autograd::backward(loss);
    tessera::current_stream(device_)->synchronize();
  }

  ActivationCheckpointPolicy policy_;
  tessera::Device device_;
  std::unique_ptr<tessera::nn::CausalLM> model_;
  tessera::Tensor idx_, targets_;
  Measured measured_;
  std::vector<double> seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string family = "gpt", preset, device_name = "cpu", policies = "off,full,every:2,selective";
  int64_t batch = 8, seq = 1024;
  int steps = 1;
  CLI::App app{"Activation memory and step time with and without activation checkpointing", "activation_memory"};
  app.add_option("--model", family, "gpt or llama")->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--preset", preset, "the family's preset (gpt: gpt2-124m, llama: llama-125m)");
  app.add_option("--batch", batch, "sequences")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--seq", seq, "tokens a sequence")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--ac", policies, "comma-separated policies, off first");
  app.add_option("--steps", steps, "timed steps after the measured one (0: memory only)")->check(CLI::Range(0, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    if (preset.empty()) preset = family == "gpt" ? "gpt2-124m" : "llama-125m";
    // f32: bf16 activations come with FSDP's param_dtype (the plan's dtype),
    // which this one-rank measure leaves out.
    const tessera::DType dtype = tessera::DType::f32;
    tessera::train::ModelConfig shape =
        tessera::train::preset_config(tessera::train::family_from_name(family), preset);
    std::visit(
        [&](auto& config) {
          config.block_size = std::max(config.block_size, seq);
        },
        shape);
    const tessera::Device device = device_name == "cuda" ? tessera::Device(tessera::DeviceType::cuda) : tessera::kCPU;
    std::vector<ActivationCheckpointPolicy> picked;
    for (size_t start = 0; start <= policies.size();) {
      const size_t end = std::min(policies.find(',', start), policies.size());
      picked.push_back(ActivationCheckpointPolicy::parse(policies.substr(start, end - start)));
      start = end + 1;
    }
    fmt::print("activation_memory: {} {} (f32), B {} T {}, {} on {}; machine: {}, {} threads, load average {}\n",
               family, preset, batch, seq, tessera::train::describe_shape(shape), device.str(),
               bench::cpu_model(), tessera::num_threads(), bench::load_average());
    fmt::print("{:<10} {:>14} {:>14} {:>10} {:>12} {:>10} {:>7}\n", "--ac", "held (bytes)", "plan (bytes)",
               "held/plan", "peak (MiB)", "step (s)", "vs off");
    std::vector<std::unique_ptr<PolicyRun>> runs;
    for (const ActivationCheckpointPolicy& policy : picked) {
      runs.push_back(std::make_unique<PolicyRun>(shape, policy, batch, seq, device));
    }
    for (int round = 0; round < steps; ++round) {
      for (const auto& run : runs) run->timed_step();
    }
    double off_seconds = 0;
    for (const auto& run : runs) {
      const ActivationCheckpointPolicy& policy = run->policy();
      const Measured measured = run->measured();
      const int64_t planned = tessera::train::plan_activation_bytes(shape, {.batch = batch, .seq_len = seq,
                                                                          .dtype = dtype, .checkpointing = policy});
      if (policy.mode == ActivationCheckpointPolicy::Mode::off) off_seconds = measured.median_seconds;
      fmt::print("{:<10} {:>14} {:>14} {:>10.4f} {:>12.1f} {:>10.3f} {:>7}\n", policy.str(),
                 measured.held_after_forward, planned,
                 static_cast<double>(measured.held_after_forward) / static_cast<double>(planned), mib(measured.peak),
                 measured.median_seconds,
                 off_seconds > 0 && steps > 0 ? fmt::format("{:.2f}x", measured.median_seconds / off_seconds) : "");
      std::fflush(stdout);
    }
  } catch (const std::exception& error) {
    fmt::print(stderr, "activation_memory: {}\n", error.what());
    return 1;
  }
  return 0;
}
