// bench/fsdp_step_prediction: a PREDICTED training step of GPT-2 124M and
// Llama 3 8B with FSDP on 8 H100 SXM GPUs (NVLink 4, NVSwitch), from the
// schedule the simulator records.
//
// The schedule. `train --device cuda --nproc 8` runs on the simulator with
// the target's layers, ranks and FSDP options, at widths the CPU can
// simulate. Rank 0's device records its second step (tensor/cuda/sim/
// schedule_recorder.h): every kernel, GEMM, copy and collective on each of
// its streams, with the events and host waits between them. That is FSDP's
// real order: copy-in, all-gather, compute, reduce-scatter streams, prefetch,
// the waits between them.
//
// The work of each op at the target's size. The small model keeps the
// target's ratios between its widths (C, F, V and the heads all shrink by one
// factor w) and its head dim's kernel (tensor-core attention). Four runs at
// (B, T) = (2, T0), (4, T0), (2, 2 T0), (4, 2 T0) give each op, separately,
//     work(B, T) = p + t T + a B T + s B T^2
// for each counted quantity (device bytes, shared bytes, FLOPs, bytes a copy
// or collective moves); a fifth run (3, T0) checks the fit. Then at the target:
// p (parameters, shards, optimizer state: ~C^2) grows by the ratio of the
// parameter counts; t, a and s (activations, attention: ~C) by w. GEMMs get
// their target shapes: a dimension that is B T (or T, or B) in every run
// becomes the target's, any other grows by w.
//
// Each op's time: bench/gpu_roofline.h's calibrated H100 (the same kernels'
// model that predicted one GPU's GPT-2 step within 1%), collectives from the
// ring model and the replay's overlap (bench/step_schedule.h), every figure
// printed with its source. The schedule's sequence must be the same in every
// run; one that is not is an error naming the first op that differs.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench/gpu_roofline.h"
#include "bench/machine_context.h"
#include "bench/recorded_step.h"
#include "bench/schedule_fit.h"
#include "bench/step_schedule.h"
#include "tensor/cuda/attention_mma.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "train/model_family.h"
#include "train/trainer.h"

using namespace tessera;
namespace sim = tessera::cuda::sim;
using sim::ScheduledOp;

namespace {

const Device kCuda(DeviceType::cuda);
constexpr int kRanks = 8;

// A model to predict, and the small model whose schedule stands for it.
struct Case {
  std::string label;
  tessera::train::ModelConfig target;
  int64_t batch = 1, seq = 1;  // per GPU
  tessera::train::ModelConfig small;
  int64_t small_seq = 64;  // T0
  DType param_dtype = DType::bf16, reduce_dtype = DType::f32;
  std::string why;  // where the target's batch and sequence come from
};

int64_t width(const tessera::train::ModelConfig& config) {
  return std::visit([](const auto& c) { return c.n_embd; }, config);
}

tessera::train::TrainConfig small_run(const Case& c, int64_t batch, int64_t seq) {
  tessera::train::TrainConfig config;
  if (tessera::train::family_of(c.small) == tessera::train::ModelFamily::llama) {
    config.llama = std::get<nn::LlamaConfig>(c.small);
  } else {
    config.model = std::get<nn::GPTConfig>(c.small);
  }
  config.preset = "fsdp_step_prediction";
  config.seq_len = seq;
  config.batch = batch;
  config.steps = 2;
  config.warmup = 0;
  config.data = tessera::train::kSyntheticData;
  config.eval_every = 0;
  config.threads = 1;
  config.device = kCuda;
  config.nproc = kRanks;
  config.param_dtype = c.param_dtype;
  config.reduce_dtype = c.reduce_dtype;
  return config;
}

using bench::RunShape;

struct Prediction {
  bench::StepTiming timing;
  double check_error = 0;
  int64_t ops = 0, collectives = 0;
  double all_gather_bytes = 0, reduce_scatter_bytes = 0;
};

Prediction predict(const Case& c, const bench::GpuModel& gpu, const bench::LinkModel& link) {
  // B from 2: at B 1 the position embedding's add has no broadcast, and
  // takes another kernel than every larger batch.
  const std::vector<RunShape> shapes = {
      {2, c.small_seq}, {4, c.small_seq}, {2, 2 * c.small_seq}, {4, 2 * c.small_seq}, {3, c.small_seq}};
  // Attention's backward hands dS over or recomputes it by a size budget:
  // the small runs take the target's choice.
  const int64_t budget = cuda::attention_score_grads_budget();
  const auto* llama = std::get_if<nn::LlamaConfig>(&c.target);
  const int64_t heads = llama ? llama->n_head : std::get<nn::GPTConfig>(c.target).n_head;
  const bool hands_over = cuda::attention_hands_over_scores({.heads = c.batch * heads,
                                                             .heads_per_batch = static_cast<int32_t>(heads),
                                                             .seq = static_cast<int32_t>(c.seq),
                                                             .dim = static_cast<int32_t>(width(c.target) / heads)});
  cuda::set_attention_score_grads_budget(hands_over ? int64_t{1} << 62 : 0);
  std::vector<std::vector<ScheduledOp>> runs;
  for (const RunShape& s : shapes) {
    const auto start = std::chrono::steady_clock::now();
    runs.push_back(bench::record_second_step(small_run(c, s.batch, s.seq)));
    fmt::print("  {}: small model at B {} T {}: {} ops recorded in {:.0f} s\n", c.label, s.batch, s.seq,
               runs.back().size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }
  cuda::set_attention_score_grads_budget(budget);
  const double w = static_cast<double>(width(c.target)) / static_cast<double>(width(c.small));
  const double param_ratio = static_cast<double>(tessera::train::num_parameters(c.target)) /
                             static_cast<double>(tessera::train::num_parameters(c.small));
  const bench::TargetScale target{.shape = {c.batch, c.seq}, .param_ratio = param_ratio, .width_ratio = w};
  const std::vector<std::vector<ScheduledOp>> fitting(runs.begin(), runs.begin() + 4);
  const std::vector<bench::FittedOp> fitted =
      bench::fit(fitting, {shapes.begin(), shapes.begin() + 4}, target, "fsdp_step_prediction");
  Prediction p;
  bench::require_same_sequence(runs, shapes, "fsdp_step_prediction");  // the check run's too
  p.check_error = bench::check_fit(fitted, runs[4], shapes[4]);
  const auto on_nvlink = [&](const ScheduledOp& op, double bytes) {
    return bench::CollectiveTiming{bench::ring_seconds(link, op.name, static_cast<int64_t>(bytes), op.ranks), 0};
  };
  const std::vector<bench::StepOp> ops = bench::target_ops(fitted, target, gpu, link, on_nvlink);
  p.timing = bench::replay(ops, link);
  p.ops = static_cast<int64_t>(ops.size());
  for (const bench::FittedOp& f : fitted) {
    if (f.op.kind != ScheduledOp::Kind::collective) continue;
    ++p.collectives;
    const double bytes = bench::evaluate(f.terms[bench::kMovedBytes], target.shape, param_ratio, w);
    if (f.op.name == "all_gather_into") p.all_gather_bytes += bytes;
    if (f.op.name == "reduce_scatter_into") p.reduce_scatter_bytes += bytes;
  }
  return p;
}

tessera::train::ModelConfig gpt_small() {
  nn::GPTConfig c = nn::GPTConfig::preset("gpt2-124m");
  c.n_embd = 128;                 // 768 / 6, 2 heads of GPT-2's 64
  c.n_head = 2;
  c.vocab_size = 8384;            // 50304 / 6 rows
  c.vocab_padding_multiple = 64;
  c.block_size = 128;
  return c;
}

tessera::train::ModelConfig llama_small() {
  nn::LlamaConfig c = nn::LlamaConfig::preset("llama3-8b");
  c.n_embd = 256;                 // 4096 / 16: 4 heads of 64 (1 kv head: Llama 3's 4 query heads per kv head)
  c.n_head = 4;
  c.n_kv_head = 1;
  c.ffn_hidden = 896;             // 14336 / 16
  c.vocab_size = 8016;            // 128256 / 16
  c.block_size = 128;
  return c;
}

std::vector<Case> cases(const std::string& which) {
  std::vector<Case> all;
  if (which == "all" || which == "gpt2") {
    all.push_back({.label = "GPT-2 124M",
                   .target = nn::GPTConfig::preset("gpt2-124m"),
                   .batch = 64,
                   .seq = 1024,
                   .small = gpt_small(),
                   .why = "llm.c's 8-GPU run: B 64, T 1024 a GPU, 524,288 tokens a step"});
  }
  if (which == "all" || which == "llama3-8b") {
    all.push_back({.label = "Llama 3 8B",
                   .target = nn::LlamaConfig::preset("llama3-8b"),
                   .batch = 1,
                   .seq = 8192,
                   .small = llama_small(),
                   .why = "torchtitan's Llama 3 8B recipe: B 1, T 8192 a GPU"});
  }
  TESSERA_CHECK(!all.empty(), "fsdp_step_prediction: --model {}: one of gpt2, llama3-8b, all", which);
  return all;
}

void report(const Case& c, const Prediction& p, nlohmann::json& out) {
  const bench::StepTiming& t = p.timing;
  const double tokens = static_cast<double>(c.batch * c.seq);
  const double flops = tessera::train::flops_per_token(c.target, c.seq) * tokens;
  const double mfu = flops / t.step_seconds / 989e12;
  fmt::print("\n{} on {} H100 SXM, FSDP, bf16 parameters, f32 reduce-scatter; {}\n", c.label, kRanks, c.why);
  fmt::print("  fit checked on (B 3, T {}): every op's every count within {:.3f}% of the run's total\n", c.small_seq,
             100 * p.check_error);
  fmt::print("  {} ops replayed, {} collectives: all-gather {:.2f} GB, reduce-scatter {:.2f} GB a step\n", p.ops,
             p.collectives, p.all_gather_bytes / 1e9, p.reduce_scatter_bytes / 1e9);
  fmt::print("  PREDICTED step                 {:9.1f} ms  ({:.0f} tokens/s a GPU, MFU {:.1f}%)\n",
             1e3 * t.step_seconds, tokens / t.step_seconds, 100 * mfu);
  fmt::print("  PREDICTED kernels alone        {:9.1f} ms  (on the SMs: {:.1f} ms, slowed by NCCL's SMs)\n",
             1e3 * t.compute_alone_seconds, 1e3 * t.compute_seconds);
  fmt::print("  PREDICTED collectives alone    {:9.1f} ms  (running: {:.1f} ms)\n", 1e3 * t.collectives_alone_seconds,
             1e3 * t.communication_seconds);
  fmt::print("  PREDICTED exposed collectives  {:9.1f} ms  ({:.1f}% of the step: no kernel runs beside them)\n",
             1e3 * t.exposed_seconds, 100 * t.exposed_seconds / t.step_seconds);
  fmt::print("  PREDICTED idle                 {:9.1f} ms\n", 1e3 * t.idle_seconds);
  out[c.label] = {{"step_ms", 1e3 * t.step_seconds},
                  {"tokens_per_second_per_gpu", tokens / t.step_seconds},
                  {"mfu", mfu},
                  {"kernels_alone_ms", 1e3 * t.compute_alone_seconds},
                  {"collectives_alone_ms", 1e3 * t.collectives_alone_seconds},
                  {"exposed_collectives_ms", 1e3 * t.exposed_seconds},
                  {"idle_ms", 1e3 * t.idle_seconds},
                  {"fit_check_error", p.check_error},
                  {"batch", c.batch},
                  {"seq", c.seq}};
}

int run(int argc, char** argv) {
  CLI::App app{"PREDICTED FSDP step of GPT-2 124M and Llama 3 8B on 8 H100s, from the simulator's schedule"};
  std::string which = "all", calibration, out_path;
  app.add_option("--model", which, "gpt2, llama3-8b or all")->capture_default_str();
  app.add_option("--calibration", calibration, "measured H100 figures (bench/data/h100_calibration.json)");
  app.add_option("--prediction-out", out_path, "write the predicted figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  const bench::LinkModel link = bench::h100_nvlink();
  const bench::GpuModel gpu = bench::start_prediction("fsdp_step_prediction", calibration, out_path, {link});
  nlohmann::json out = {{"source", "PREDICTED by bench/fsdp_step_prediction for 8 x H100 SXM (NVLink 4)"}};
  for (const Case& c : cases(which)) report(c, predict(c, gpu, link), out);
  bench::write_prediction(out, out_path, "fsdp_step_prediction");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "fsdp_step_prediction: {}\n", error.what());
    return 1;
  }
}
