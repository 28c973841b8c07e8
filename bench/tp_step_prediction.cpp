// bench/tp_step_prediction: a PREDICTED training step of Llama 3 70B on 256
// H100 SXM GPUs as 32 nodes of 8, FSDP 32 x TP 8 (tp inside a node on NVLink,
// FSDP across nodes on one 400 Gb/s NIC a GPU), bf16 parameters, f32
// reduce-scatter: torchtitan's published layout, local batch 16, T 8192.
//
// The schedule. `train --device cuda --nproc 16 --tp 8` runs a small Llama on
// the simulator: (shard 2, tp 8), the smallest mesh whose schedule holds both
// kinds of collective, each on its own group and stream, in the order tessera
// issues them. Its widths are the target's over w = 8 with the same tp-local
// structure (8 query heads and 1 key/value head a rank, a 1/8 slice of the
// MLP and of the vocabulary). It keeps head dim 64, so that its attention
// runs the tensor-core kernels (64 or 128) and each rank has two query heads
// a key/value head; the key/value GEMMs' width is mapped to the target's
// (64 -> 128) instead of growing by w. bench/schedule_fit.h fits each op's
// work over four sizes and checks it on a fifth.
//
// Layers. The small model runs with 2 and with 3 blocks; the difference of
// the two replays is one block inside the pipeline (prefetched, overlapped as
// its neighbours are), and the target's step is the 2-block step plus 78 of
// them. The forward's share of that block is what full activation
// checkpointing recomputes: each block's forward again inside its backward,
// with its TP collectives, without FSDP's all-gathers (the block is gathered
// then). tessera has no activation checkpointing yet; this models it.
//
// Collectives by group: "tp" on the NVLink ring of 8, "shard" on the
// InfiniBand ring of 32 ranks (the dp ring crosses the 32 nodes), "world" on
// the InfiniBand ring of all 256 (only the norm's and the loss's scalars).
//
// Async TP (`--async-tp K`): the same step with the sequence all-gathers
// fused into the column-wise products and the reduce-scatters into the
// row-wise ones, K batch chunks each (tp/collective_matmul.h). The same
// replay predicts what overlapping them gains.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
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
using bench::RunShape;
using sim::ScheduledOp;

namespace {

constexpr const char* kProgram = "tp_step_prediction";
constexpr int kTensorParallel = 8;  // a node's GPUs
constexpr int kDataParallel = 32;   // nodes
constexpr int kRecordedShards = 2;  // the small run's dp
constexpr int64_t kBatch = 16;      // sequences a dp rank, shared by its 8 tp ranks (torchtitan's "local batch")
constexpr int64_t kSeq = 8192;
constexpr int64_t kSmallSeq = 32;   // T0: a multiple of tp and of the attention tile
constexpr int kLinkNvlink = 0, kLinkInfiniband = 1;

nn::LlamaConfig target_model() { return nn::LlamaConfig::preset("llama3-70b"); }

// The target over w = 8: C 1024, F 3584, V 16032; 16 heads of 64 over 8
// key/value heads (the target: 64 of 128 over 8).
nn::LlamaConfig small_model(int64_t layers) {
  nn::LlamaConfig c = target_model();
  c.n_embd = 1024;
  c.n_head = 16;
  c.n_kv_head = 8;
  c.ffn_hidden = 3584;
  c.vocab_size = 16032;
  c.block_size = 4 * kSmallSeq;  // as the committed async fit ran (RoPE tables of 128 positions)
  c.n_layer = layers;
  return c;
}
constexpr double kWidthRatio = 8;

int64_t key_value_width_per_rank(const nn::LlamaConfig& c) { return c.n_kv_head * c.head_dim() / kTensorParallel; }

tessera::train::TrainConfig small_run(int64_t layers, int64_t batch, int64_t seq, int async_chunks) {
  tessera::train::TrainConfig config;
  config.llama = small_model(layers);
  config.preset = kProgram;
  config.seq_len = seq;
  config.batch = batch;
  config.steps = 2;
  config.warmup = 0;
  config.data = tessera::train::kSyntheticData;
  config.eval_every = 0;
  config.threads = 1;
  config.device = Device(DeviceType::cuda);
  config.nproc = kRecordedShards * kTensorParallel;
  config.tp = kTensorParallel;
  config.async_tp = async_chunks;
  config.param_dtype = DType::bf16;
  config.reduce_dtype = DType::f32;
  return config;
}

// One replayed step at the target's widths, with the small model's layers.
struct Replayed {
  bench::StepTiming timing;
  double forward_seconds = 0;  // from the step's first op to the loss
  double check_error = 0;
  double tp_bytes = 0, shard_bytes = 0;  // the collectives' buffers, by group
  int64_t ops = 0;
  std::map<std::string, double> kernel_seconds;  // SM work by name, each op alone
};

// Where the forward ends: the vocabulary-parallel loss's first all-reduce
// over tp (the logits' row maxima). The blocks' TP collectives before it are
// all-gathers and reduce-scatters; the partial gradients' sums come after.
size_t first_loss_op(const std::vector<ScheduledOp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == ScheduledOp::Kind::collective && ops[i].group == "tp" && ops[i].name == "all_reduce") return i;
  }
  tessera::fail("{}: the recorded step has no all-reduce over tp to mark the loss, the end of its forward", kProgram);
}

bench::CollectiveTiming time_collective(const std::vector<bench::LinkModel>& links, const ScheduledOp& op,
                                        double bytes) {
  const auto ring = [&](int link, int ranks) {
    return bench::CollectiveTiming{bench::ring_seconds(links[link], op.name, static_cast<int64_t>(bytes), ranks), link};
  };
  if (op.group == "tp") return ring(kLinkNvlink, op.ranks);
  if (op.group == "shard") return ring(kLinkInfiniband, kDataParallel);
  if (op.group == "world") return ring(kLinkInfiniband, kDataParallel * kTensorParallel);
  tessera::fail("{}: a collective ('{}') on group '{}', which this prediction does not place on a link (tp, shard, "
                "world)",
                kProgram, op.name, op.group);
}

// The fitted sizes, the same for every variant so that their ratio compares
// like for like: B from 2 K (the fit's basis) for async TP in K chunks, so
// that every chunk holds at least 2 sequences, as at the target (a chunk of
// one sequence skips a copy, its gathered pieces being in order already, and
// would record another schedule). T0 = 32 keeps every run's B T within
// one power of two's sort (the embedding's backward sorts the token ids in
// log2(B T) bitonic stages).
std::vector<RunShape> fitted_shapes(int shape_chunks) {
  const int64_t k = shape_chunks;
  return {{2 * k, kSmallSeq}, {3 * k, kSmallSeq}, {2 * k, 2 * kSmallSeq}, {3 * k, 2 * kSmallSeq}, {4 * k, kSmallSeq}};
}

Replayed replay_layers(int64_t layers, int async_chunks, int shape_chunks, const bench::GpuModel& gpu,
                       const std::vector<bench::LinkModel>& links) {
  const std::vector<RunShape> shapes = fitted_shapes(shape_chunks);
  std::vector<std::vector<ScheduledOp>> runs;
  for (const RunShape& s : shapes) {
    const auto start = std::chrono::steady_clock::now();
    runs.push_back(bench::record_second_step(small_run(layers, s.batch, s.seq, async_chunks)));
    fmt::print("  {} blocks{}: B {} T {}: {} ops recorded in {:.0f} s\n", layers,
               async_chunks > 0 ? fmt::format(", async TP {}", async_chunks) : "", s.batch, s.seq, runs.back().size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }
  const nn::LlamaConfig target = target_model();
  nn::LlamaConfig small_at_target_depth = small_model(target.n_layer);
  const bench::TargetScale scale{
      .shape = {kBatch, kSeq},
      .param_ratio = static_cast<double>(target.num_parameters()) /
                     static_cast<double>(small_at_target_depth.num_parameters()),
      .width_ratio = kWidthRatio,
      .gemm_widths = {{key_value_width_per_rank(small_model(layers)), key_value_width_per_rank(target)}}};
  const std::vector<std::vector<ScheduledOp>> fitting(runs.begin(), runs.begin() + 4);
  const std::vector<bench::FittedOp> fitted =
      bench::fit(fitting, {shapes.begin(), shapes.begin() + 4}, scale, kProgram);
  bench::require_same_sequence(runs, shapes, kProgram);
  Replayed r;
  r.check_error = bench::check_fit(fitted, runs[4], shapes[4]);
  const std::vector<bench::StepOp> ops =
      bench::target_ops(fitted, scale, gpu, links[kLinkNvlink],
                        [&](const ScheduledOp& op, double bytes) { return time_collective(links, op, bytes); });
  r.timing = bench::replay(ops, links);
  r.ops = static_cast<int64_t>(ops.size());
  double first = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == bench::StepOp::Kind::work) first = std::min(first, r.timing.start[i]);
  }
  r.forward_seconds = r.timing.start[first_loss_op(runs[0])] - first;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == bench::StepOp::Kind::work && ops[i].engine == bench::Engine::sms) {
      const ScheduledOp& op = runs[0][i];
      r.kernel_seconds[op.kind == ScheduledOp::Kind::gemm ? fmt::format("GEMM {}x{}x{}", fitted[i].gemm_dims[0],
                                                                        fitted[i].gemm_dims[1], fitted[i].gemm_dims[2])
                                                          : op.name] += ops[i].seconds;
    }
  }
  for (const bench::FittedOp& f : fitted) {
    if (f.op.kind != ScheduledOp::Kind::collective) continue;
    const double bytes = bench::evaluate(f.terms[bench::kMovedBytes], scale.shape, scale.param_ratio, kWidthRatio);
    if (f.op.group == "tp") r.tp_bytes += bytes;
    if (f.op.group == "shard") r.shard_bytes += bytes;
  }
  return r;
}

// The target's 80 blocks from the 2- and 3-block replays.
struct Prediction {
  double step = 0, forward_block = 0, compute_alone = 0, exposed = 0, exposed_tp = 0, exposed_dp = 0;
  double tp_alone = 0, tp_bytes = 0, shard_bytes = 0, check_error = 0;
  double step_full_ac = 0;
  std::vector<std::pair<double, std::string>> kernels;  // seconds a step by name, the largest first
};

Prediction extrapolate(const Replayed& two, const Replayed& three, int64_t layers) {
  const double more = static_cast<double>(layers - 2);
  const auto grow = [&](double at_two, double at_three) { return at_two + more * (at_three - at_two); };
  Prediction p;
  p.step = grow(two.timing.step_seconds, three.timing.step_seconds);
  p.forward_block = three.forward_seconds - two.forward_seconds;
  p.compute_alone = grow(two.timing.compute_alone_seconds, three.timing.compute_alone_seconds);
  p.exposed = grow(two.timing.exposed_seconds, three.timing.exposed_seconds);
  p.exposed_tp =
      grow(two.timing.exposed_seconds_by_link[kLinkNvlink], three.timing.exposed_seconds_by_link[kLinkNvlink]);
  p.exposed_dp =
      grow(two.timing.exposed_seconds_by_link[kLinkInfiniband], three.timing.exposed_seconds_by_link[kLinkInfiniband]);
  p.tp_alone = grow(two.timing.communication_seconds_by_link[kLinkNvlink],
                    three.timing.communication_seconds_by_link[kLinkNvlink]);
  p.tp_bytes = grow(two.tp_bytes, three.tp_bytes);
  p.shard_bytes = grow(two.shard_bytes, three.shard_bytes);
  p.check_error = std::max(two.check_error, three.check_error);
  p.step_full_ac = p.step + static_cast<double>(layers) * p.forward_block;
  std::map<std::string, double> names = two.kernel_seconds;
  for (const auto& [name, seconds] : three.kernel_seconds) names[name] += 0;
  for (const auto& [name, seconds] : names) {
    const auto in = [&](const Replayed& r) {
      const auto found = r.kernel_seconds.find(name);
      return found == r.kernel_seconds.end() ? 0.0 : found->second;
    };
    p.kernels.emplace_back(grow(in(two), in(three)), name);
  }
  std::sort(p.kernels.rbegin(), p.kernels.rend());
  return p;
}

nlohmann::json report(const std::string& label, const Prediction& p) {
  const nn::LlamaConfig target = target_model();
  const double tokens_per_gpu = static_cast<double>(kBatch * kSeq) / kTensorParallel;
  const double flops_per_gpu = target.flops_per_token(kSeq) * tokens_per_gpu;
  fmt::print("\n{}\n", label);
  fmt::print("  fit checked on a fifth size: every op's every count within {:.3f}% of the run's total\n",
             100 * p.check_error);
  fmt::print("  a step moves {:.2f} GB on tp (NVLink) and {:.2f} GB on dp (InfiniBand) a GPU's buffers\n",
             p.tp_bytes / 1e9, p.shard_bytes / 1e9);
  const auto line = [&](const char* what, double seconds) {
    fmt::print("  PREDICTED {:<34} {:8.2f} s  ({:.0f} tokens/s a GPU, MFU {:.1f}%)\n", what, seconds,
               tokens_per_gpu / seconds, 100 * flops_per_gpu / seconds / 989e12);
  };
  line("step, no activation checkpointing", p.step);
  line("step, full AC (modelled)", p.step_full_ac);
  fmt::print("  PREDICTED kernels alone                      {:8.2f} s\n", p.compute_alone);
  fmt::print("  PREDICTED TP collectives (NVLink) running    {:8.2f} s, exposed {:.2f} s ({:.1f}% of the step)\n",
             p.tp_alone, p.exposed_tp, 100 * p.exposed_tp / p.step);
  fmt::print("  PREDICTED dp collectives exposed (IB)        {:8.2f} s\n", p.exposed_dp);
  fmt::print("  PREDICTED one block's forward (recomputed)   {:8.2f} ms\n", 1e3 * p.forward_block);
  fmt::print("  PREDICTED kernels a step, the largest (GEMMs as cuBLASLt's m x n x k):\n");
  for (size_t i = 0; i < std::min<size_t>(12, p.kernels.size()); ++i) {
    fmt::print("    {:8.3f} s  {}\n", p.kernels[i].first, p.kernels[i].second);
  }
  return {{"step_s", p.step},
          {"step_full_ac_s", p.step_full_ac},
          {"tokens_per_second_per_gpu", tokens_per_gpu / p.step},
          {"tokens_per_second_per_gpu_full_ac", tokens_per_gpu / p.step_full_ac},
          {"mfu_full_ac", flops_per_gpu / p.step_full_ac / 989e12},
          {"kernels_alone_s", p.compute_alone},
          {"tp_collectives_running_s", p.tp_alone},
          {"tp_exposed_s", p.exposed_tp},
          {"dp_exposed_s", p.exposed_dp},
          {"forward_block_ms", 1e3 * p.forward_block},
          {"tp_bytes", p.tp_bytes},
          {"dp_bytes", p.shard_bytes},
          {"fit_check_error", p.check_error}};
}

int run(int argc, char** argv) {
  CLI::App app{"PREDICTED Llama 3 70B step on 256 H100s, FSDP 32 x TP 8, from the simulator's schedule"};
  std::string calibration, out_path;
  int async_chunks = 2;
  app.add_option("--calibration", calibration, "measured H100 figures (bench/data/h100_calibration.json)");
  app.add_option("--async-tp", async_chunks, "also predict async TP with K batch chunks (0: vanilla TP only)")
      ->capture_default_str()
      ->check(CLI::Range(0, 8));
  bool skip_vanilla = false, skip_async = false;
  app.add_flag("--skip-vanilla", skip_vanilla, "predict only async TP (the two are independent runs; this reruns one)");
  app.add_flag("--skip-async", skip_async, "predict only vanilla TP, fitted at --async-tp K's sizes");
  app.add_option("--prediction-out", out_path, "write the predicted figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  TESSERA_CHECK(async_chunks != 1, "{}: --async-tp 1 is vanilla TP's schedule in one chunk; give 0 or 2 to 8",
                kProgram);
  const std::vector<bench::LinkModel> links = {bench::h100_nvlink(), bench::h100_infiniband()};
  const bench::GpuModel gpu = bench::start_prediction(kProgram, calibration, out_path, links);
  // Attention's backward hands dS over or recomputes it by a size budget:
  // the small runs take the target's choice (a rank's 8 heads at T 8192: recompute).
  const nn::LlamaConfig target = target_model();
  const int64_t budget = cuda::attention_score_grads_budget();
  const int64_t local_heads = target.n_head / kTensorParallel;
  const bool hands_over = cuda::attention_hands_over_scores({.heads = kBatch * local_heads,
                                                             .heads_per_batch = static_cast<int32_t>(local_heads),
                                                             .seq = static_cast<int32_t>(kSeq),
                                                             .dim = static_cast<int32_t>(target.head_dim())});
  cuda::set_attention_score_grads_budget(hands_over ? int64_t{1} << 62 : 0);
  nlohmann::json out = {{"source", "PREDICTED by bench/tp_step_prediction: Llama 3 70B on 256 H100 SXM, FSDP 32 x "
                                   "TP 8, bf16, local batch 16, T 8192"}};
  TESSERA_CHECK(!skip_vanilla || async_chunks > 1, "{}: --skip-vanilla with no --async-tp leaves nothing to predict",
                kProgram);
  TESSERA_CHECK(!(skip_vanilla && skip_async), "{}: --skip-vanilla with --skip-async leaves nothing to predict",
                kProgram);
  std::vector<int> variants;
  if (!skip_vanilla) variants.push_back(0);
  if (async_chunks > 1 && !skip_async) variants.push_back(async_chunks);
  // With no async variant, vanilla is fitted at the default async's sizes (2 chunks).
  const int shape_chunks = async_chunks > 1 ? async_chunks : 2;
  std::vector<Prediction> predictions;
  for (const int chunks : variants) {
    const Replayed two = replay_layers(2, chunks, shape_chunks, gpu, links);
    const Replayed three = replay_layers(3, chunks, shape_chunks, gpu, links);
    const Prediction p = extrapolate(two, three, target.n_layer);
    const std::string label = chunks == 0 ? "vanilla TP" : fmt::format("async TP, {} chunks", chunks);
    out[label] = report(fmt::format("Llama 3 70B, 256 H100 SXM, FSDP 32 x TP 8, local batch 16, T 8192: {}", label), p);
    predictions.push_back(p);
  }
  cuda::set_attention_score_grads_budget(budget);
  if (predictions.size() == 2) {
    fmt::print("\nPREDICTED async TP against vanilla TP: {:.3f}x the tokens/s with full AC ({:.3f}x without)\n",
               predictions[0].step_full_ac / predictions[1].step_full_ac, predictions[0].step / predictions[1].step);
  }
  fmt::print("Anchor (torchtitan, benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, June 2025): the same model, "
             "mesh, local batch 16 and full AC on 256 H100s (96 GB HBM2e at 2.4 TB/s, 500 W), torch.compile, bf16: "
             "597.3 tokens/s a GPU vanilla TP, 652.4 async (1.09x).\n");
  bench::write_prediction(out, out_path, kProgram);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "{}: {}\n", kProgram, error.what());
    return 1;
  }
}
