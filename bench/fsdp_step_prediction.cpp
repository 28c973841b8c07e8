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

// The four fitting runs and the check, in the basis' order.
struct Shape {
  int64_t batch, seq;
};
std::array<double, 4> basis(const Shape& s) {
  const double b = static_cast<double>(s.batch), t = static_cast<double>(s.seq);
  return {1.0, t, b * t, b * t * t};
}

// Solves the 4 x 4 system rows x = values (Gaussian elimination, partial pivoting).
std::array<double, 4> solve(std::array<std::array<double, 4>, 4> rows, std::array<double, 4> values) {
  for (int column = 0; column < 4; ++column) {
    int pivot = column;
    for (int r = column + 1; r < 4; ++r) {
      if (std::abs(rows[r][column]) > std::abs(rows[pivot][column])) pivot = r;
    }
    std::swap(rows[column], rows[pivot]);
    std::swap(values[column], values[pivot]);
    for (int r = column + 1; r < 4; ++r) {
      const double factor = rows[r][column] / rows[column][column];
      for (int k = column; k < 4; ++k) rows[r][k] -= factor * rows[column][k];
      values[r] -= factor * values[column];
    }
  }
  std::array<double, 4> x{};
  for (int r = 3; r >= 0; --r) {
    double sum = values[r];
    for (int k = r + 1; k < 4; ++k) sum -= rows[r][k] * x[k];
    x[r] = sum / rows[r][r];
  }
  return x;
}

// The quantities fitted per op.
enum Quantity { kDeviceBytes, kSharedBytes, kFlops, kMovedBytes, kQuantities };
double quantity(const ScheduledOp& op, int q) {
  switch (q) {
    case kDeviceBytes: return static_cast<double>(op.device_bytes);
    case kSharedBytes: return static_cast<double>(op.shared_bytes);
    case kFlops: return static_cast<double>(op.flops);
    default: return static_cast<double>(op.bytes);
  }
}

struct FittedOp {
  ScheduledOp op;                                       // from the first run
  std::array<std::array<double, 4>, kQuantities> terms;  // p, t, a, s per quantity
  std::array<double, 3> gemm_dims{};                    // m, n, k at the target
  double gemm_batch = 1;
};

const char* kind_name(ScheduledOp::Kind kind) {
  constexpr std::array<const char*, 7> names = {"kernel", "gemm", "copy", "collective", "record", "wait", "host wait"};
  return names[static_cast<size_t>(kind)];
}

// A GEMM dimension at the target: B T, T or B if it is that in every run,
// else a width (the same in every run), grown by w.
double target_dimension(const std::vector<int64_t>& per_run, const std::vector<Shape>& shapes, const Shape& target,
                        double w, size_t op) {
  const auto every = [&](auto value_of) {
    for (size_t r = 0; r < per_run.size(); ++r) {
      if (per_run[r] != value_of(shapes.at(r))) return false;
    }
    return true;
  };
  if (every([](const Shape& s) { return s.batch * s.seq; })) return static_cast<double>(target.batch * target.seq);
  if (every([](const Shape& s) { return s.seq; })) return static_cast<double>(target.seq);
  if (every([](const Shape& s) { return s.batch; })) return static_cast<double>(target.batch);
  if (every([&](const Shape&) { return per_run[0]; })) return static_cast<double>(per_run[0]) * w;
  std::string values;
  for (size_t r = 0; r < per_run.size(); ++r) {
    values += fmt::format(" {} at (B {}, T {});", per_run[r], shapes.at(r).batch, shapes.at(r).seq);
  }
  tessera::fail("fsdp_step_prediction: GEMM op {} has a dimension that is neither B T, T, B nor fixed:{}", op, values);
}

// Every run must give the same sequence of ops (kind, stream, name, event):
// the fit matches ops by their place in it.
void require_same_sequence(const std::vector<std::vector<ScheduledOp>>& runs, const std::vector<Shape>& shapes) {
  const std::vector<ScheduledOp>& first = runs[0];
  for (size_t r = 1; r < runs.size(); ++r) {
    const std::vector<ScheduledOp>& other = runs[r];
    for (size_t i = 0; i < std::max(first.size(), other.size()); ++i) {
      const bool same = i < first.size() && i < other.size() && first[i].kind == other[i].kind &&
                        first[i].stream == other[i].stream && first[i].name == other[i].name &&
                        first[i].event == other[i].event;
      TESSERA_CHECK(same,
                    "fsdp_step_prediction: the schedules of (B {}, T {}) and (B {}, T {}) differ at op {}: {} against "
                    "{}; the prediction needs one sequence of ops for every size",
                    shapes[0].batch, shapes[0].seq, shapes[r].batch, shapes[r].seq, i,
                    i < first.size() ? fmt::format("{} '{}' on stream {}", kind_name(first[i].kind), first[i].name,
                                                   first[i].stream)
                                     : "the end",
                    i < other.size() ? fmt::format("{} '{}' on stream {}", kind_name(other[i].kind), other[i].name,
                                                   other[i].stream)
                                     : "the end");
    }
  }
}

// `runs` and `shapes`: the four fitting runs.
std::vector<FittedOp> fit(const std::vector<std::vector<ScheduledOp>>& runs, const std::vector<Shape>& shapes,
                          const Shape& target, double w) {
  TESSERA_CHECK(runs.size() == 4 && shapes.size() == 4, "fsdp_step_prediction: the fit takes 4 runs, got {}",
                runs.size());
  require_same_sequence(runs, shapes);
  const std::vector<ScheduledOp>& first = runs[0];
  std::array<std::array<double, 4>, 4> rows{};
  for (int r = 0; r < 4; ++r) rows[r] = basis(shapes[r]);
  std::vector<FittedOp> fitted;
  for (size_t i = 0; i < first.size(); ++i) {
    FittedOp f{first[i], {}, {}, 1};
    for (int q = 0; q < kQuantities; ++q) {
      std::array<double, 4> values{};
      for (int r = 0; r < 4; ++r) values[r] = quantity(runs[r][i], q);
      f.terms[q] = solve(rows, values);
    }
    if (first[i].kind == ScheduledOp::Kind::gemm) {
      const auto dims = [&](auto member) {
        std::vector<int64_t> per_run;
        for (const auto& run : runs) per_run.push_back(run[i].*member);
        return target_dimension(per_run, shapes, target, w, i);
      };
      f.gemm_dims = {dims(&ScheduledOp::m), dims(&ScheduledOp::n), dims(&ScheduledOp::k)};
      std::vector<int64_t> batches;
      for (const auto& run : runs) batches.push_back(run[i].batch);
      f.gemm_batch = batches[0] == 1 ? 1 : target_dimension(batches, shapes, target, 1.0, i);
    }
    fitted.push_back(std::move(f));
  }
  return fitted;
}

double evaluate(const std::array<double, 4>& terms, const Shape& s, double param_ratio, double w) {
  const std::array<double, 4> x = basis(s);
  return terms[0] * param_ratio * x[0] + w * (terms[1] * x[1] + terms[2] * x[2] + terms[3] * x[3]);
}

// The fit against a run it did not see: the largest error of any op's
// quantity, relative to the run's total of that quantity.
double check_fit(const std::vector<FittedOp>& fitted, const std::vector<ScheduledOp>& check, const Shape& s) {
  double worst = 0;
  for (int q = 0; q < kQuantities; ++q) {
    double total = 0;
    for (const ScheduledOp& op : check) total += quantity(op, q);
    if (total == 0) continue;
    for (size_t i = 0; i < fitted.size(); ++i) {
      const double error = std::abs(evaluate(fitted[i].terms[q], s, 1.0, 1.0) - quantity(check[i], q));
      worst = std::max(worst, error / total);
    }
  }
  return worst;
}

bool is_attention_mma(const std::string& name) {
  return name.find("attention") != std::string::npos && name.find("mma") != std::string::npos;
}

// The replay's ops at the target, each with its predicted seconds.
std::vector<bench::StepOp> target_ops(const std::vector<FittedOp>& fitted, const Shape& target, double param_ratio,
                                      double w, const bench::GpuModel& gpu, const bench::LinkModel& link) {
  std::vector<bench::StepOp> ops;
  for (const FittedOp& f : fitted) {
    const ScheduledOp& op = f.op;
    bench::StepOp out = bench::step_op(op);
    const auto at_target = [&](int q) { return std::max(0.0, evaluate(f.terms[q], target, param_ratio, w)); };
    switch (op.kind) {
      case ScheduledOp::Kind::record:
      case ScheduledOp::Kind::wait:
      case ScheduledOp::Kind::host_wait: break;
      case ScheduledOp::Kind::collective:
        out.seconds = bench::ring_seconds(link, op.name, static_cast<int64_t>(at_target(kMovedBytes)), op.ranks);
        break;
      case ScheduledOp::Kind::copy: {
        const double bytes = at_target(kMovedBytes);
        if (op.name.find("host to device") != std::string::npos) {
          out.engine = bench::Engine::host_to_device;
          out.seconds = bytes / link.host_bytes_per_second.value;
        } else if (op.name.find("device to host") != std::string::npos) {
          out.engine = bench::Engine::device_to_host;
          out.seconds = bytes / link.host_bytes_per_second.value;
        } else {
          const bench::KernelWork copy{.name = op.name, .launches = 1, .hbm_bytes = 2 * bytes, .gemms = {}};
          out.seconds = bench::predict_kernel(gpu, copy).seconds;
        }
        break;
      }
      case ScheduledOp::Kind::kernel:
      case ScheduledOp::Kind::gemm: {
        bench::KernelWork work{.name = op.name,
                               .launches = 1,
                               .hbm_bytes = at_target(kDeviceBytes),
                               .shared_bytes = at_target(kSharedBytes),
                               .flops = at_target(kFlops),
                               .gemms = {}};
        if (op.kind == ScheduledOp::Kind::gemm) {
          work.unit = bench::ComputeUnit::tensor_core_gemm;
          const auto [m, n, k] = f.gemm_dims;
          work.flops = 2 * m * n * k * f.gemm_batch;
          // cuBLASLt's column-major D[m, n] is tessera's row-major [n, m]:
          // the roofline's table holds row-major shapes (rows, out, in).
          work.gemms = {{{static_cast<int64_t>(n), static_cast<int64_t>(m), static_cast<int64_t>(k)}, f.gemm_batch}};
        } else if (is_attention_mma(op.name)) {
          work.unit = bench::ComputeUnit::tensor_core_attention;
        } else {
          // CUDA-core arithmetic is not counted; one FLOP per byte, as
          // gpt2_step_prediction assumes, never binds at these rates.
          work.flops = work.hbm_bytes;
        }
        out.seconds = bench::predict_kernel(gpu, work).seconds;
        break;
      }
    }
    ops.push_back(std::move(out));
  }
  return ops;
}

struct Prediction {
  bench::StepTiming timing;
  double check_error = 0;
  int64_t ops = 0, collectives = 0;
  double all_gather_bytes = 0, reduce_scatter_bytes = 0;
};

Prediction predict(const Case& c, const bench::GpuModel& gpu, const bench::LinkModel& link) {
  // B from 2: at B 1 the position embedding's add has no broadcast, and
  // takes another kernel than every larger batch.
  const std::vector<Shape> shapes = {
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
  for (const Shape& s : shapes) {
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
  const Shape target{c.batch, c.seq};
  const std::vector<std::vector<ScheduledOp>> fitting(runs.begin(), runs.begin() + 4);
  const std::vector<FittedOp> fitted = fit(fitting, {shapes.begin(), shapes.begin() + 4}, target, w);
  Prediction p;
  require_same_sequence(runs, shapes);  // the check run's too
  p.check_error = check_fit(fitted, runs[4], shapes[4]);
  const std::vector<bench::StepOp> ops = target_ops(fitted, target, param_ratio, w, gpu, link);
  p.timing = bench::replay(ops, link);
  p.ops = static_cast<int64_t>(ops.size());
  for (const FittedOp& f : fitted) {
    if (f.op.kind != ScheduledOp::Kind::collective) continue;
    ++p.collectives;
    const double bytes = evaluate(f.terms[kMovedBytes], target, param_ratio, w);
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
  // Checked before the minutes of simulation, so a typo cannot cost them or the calibration file.
  TESSERA_CHECK(out_path.empty() || calibration.empty() || !std::filesystem::exists(out_path) ||
                    !std::filesystem::equivalent(out_path, calibration),
                "fsdp_step_prediction: --prediction-out {} is the --calibration file; it would be overwritten",
                out_path);
  fmt::print("# fsdp_step_prediction: simulated on {} (load {})\n", bench::cpu_model(), bench::load_average());
  bench::GpuModel gpu = bench::h100_sxm();
  if (!calibration.empty()) bench::apply_calibration_file(gpu, calibration);
  const bench::LinkModel link = bench::h100_nvlink();
  fmt::print("PREDICTED, not measured. The GPU:\n");
  for (const std::string& line : bench::describe(gpu)) fmt::print("  {}\n", line);
  fmt::print("The links:\n");
  for (const std::string& line : bench::describe(link)) fmt::print("  {}\n", line);
  nlohmann::json out = {{"source", "PREDICTED by bench/fsdp_step_prediction for 8 x H100 SXM (NVLink 4)"}};
  for (const Case& c : cases(which)) report(c, predict(c, gpu, link), out);
  if (!out_path.empty()) {
    std::ofstream file(out_path);
    file << out.dump(2) << "\n";
    TESSERA_CHECK(file.good(), "fsdp_step_prediction: cannot write --prediction-out {}", out_path);
  }
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
