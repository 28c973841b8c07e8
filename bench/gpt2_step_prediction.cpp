// bench/gpt2_step_prediction: a PREDICTED H100 SXM time per training step of
// GPT-2 124M in bf16 (B = 16, 32, 64; T = 1024), from what the simulator counts.
//
// It runs real training steps (gpt::Trainer, FSDP over one rank with
// param_dtype bf16: the code path of `train --device cuda --param-dtype bf16`)
// on the simulated cuda device, at GPT-2 124M's exact widths (C 768, 12 heads
// of 64, vocab 50257, wpe 1024 rows) but with fewer layers and shorter, smaller
// batches: the CPU cannot simulate B = 16, T = 1024, 12 layers. Each kernel's
// launches, device bytes and FLOPs are then scaled with an explicit model,
// fitted per kernel name over five reduced runs and checked on a sixth:
//
//   count(L, B, T) = c1 + cL L + cBT B T + cLBT L B T + cT T          (every kernel but attention's)
//   count(L, B, T) = aL L + aLBT L B T + aLBT2 L B T^2                (attention's tiled kernels)
//
// - L B T: a layer's GEMMs, elementwise, norm, dropout kernels are linear in
//   the rows they see; B T alone: embeddings, final norm, the tied head's
//   GEMMs and the fused cross-entropy over 50257 columns;
// - L and 1: per-step work on parameters (AdamW, the gradient norm, zeroing
//   and casting gradients, FSDP's bf16 parameter copies): per layer, and for
//   wte, wpe and ln_f;
// - T: the position embedding's rows (its gradient touches T of wpe's rows);
// - L B T^2: the causal attention's tiling. An owned tile of 32 queries
//   streams every 32-key tile up to the diagonal, so per head k and v are read
//   (T / 32 + 1) / 2 times (bytes: L B T and L B T^2 terms, exact for T a
//   multiple of 32), and the visible (query, key) pairs are T (T + 1) / 2.
//
// Launches do not grow with B or T (grid-stride loops cover any size), only
// with L: launches(L) = c1 + cL L per kernel, a least-squares fit over the
// five runs. (Fitting them like bytes let a small run's choice of a packed
// or an element-wise kernel variant extrapolate to thousands of launches.)
//
// Prediction per kernel: max(bytes / 3.35 TB/s, FLOPs / peak), plus a stated
// launch overhead. GEMMs (cublasLtMatmul, bf16 in, f32 accumulate) at the
// dense bf16 tensor-core peak (989 TFLOP/s); every other kernel runs on CUDA
// cores (attention included: it uses no tensor cores, attention.cu says why)
// and is held to the f32 peak (67 TFLOP/s). A paper estimate: caches, clocks,
// overlap between kernels and GEMM efficiency are not in it.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/machine_context.h"
#include "checkpoint/file_roles.h"
#include "examples/gpt/resource_limits.h"
#include "examples/gpt/trainer.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/stream.h"

using namespace tessera;
namespace sim = tessera::cuda::sim;

namespace {

constexpr double kHbmBytesPerSecond = 3.35e12;        // H100 SXM, HBM3
constexpr double kF32FlopsPerSecond = 67e12;          // H100 SXM, f32 on CUDA cores
constexpr double kBf16TensorFlopsPerSecond = 989e12;  // H100 SXM, dense bf16 on tensor cores
constexpr double kLaunchSeconds = 3e-6;               // per launch, cudaLaunchKernel's usual 2-4 us; printed apart
constexpr int64_t kHeadDim = 64, kHeads = 12, kChannels = 768;
const Device kCuda(DeviceType::cuda);

struct Shape3 {
  int64_t layers, batch, seq;
};

// What one kernel name did in one counted step.
struct Count {
  double launches = 0, bytes = 0, flops = 0;
};
using StepCounts = std::map<std::string, Count>;

struct Run {
  Shape3 shape;
  StepCounts counts;
  int64_t peak_bytes = 0;
  double seconds = 0;
};

gpt::TrainConfig gpt2_config(const Shape3& shape) {
  gpt::TrainConfig config;
  config.preset = "gpt2-124m";
  config.model = nn::GPTConfig::preset("gpt2-124m");
  config.model.n_layer = shape.layers;
  config.seq_len = shape.seq;
  config.batch = shape.batch;
  config.grad_accum = 1;
  config.steps = 2;
  config.lr = 6e-4;
  config.warmup = 0;
  config.data = gpt::kSyntheticData;
  config.eval_every = 0;
  config.threads = 1;
  config.device = kCuda;
  config.param_dtype = DType::bf16;
  return config;
}

// Two steps; the second (steady state: AdamW's moments exist, the allocator
// is warm) is counted.
Run count_step(const Shape3& shape) {
  Run run{shape, {}, 0, 0};
  const gpt::TrainConfig config = gpt2_config(shape);
  const auto start = std::chrono::steady_clock::now();
  gpt::init_distributed(config, [&](const gpt::Distributed& distributed) {
    gpt::Trainer trainer(config, gpt::build_data(config), distributed);
    trainer.train_step();
    current_stream(kCuda)->synchronize();
    sim::reset_kernel_counters();
    const gpt::StepMetrics metrics = trainer.train_step();
    current_stream(kCuda)->synchronize();
    for (const auto& [name, counters] : sim::kernel_counters()) {
      run.counts[name] = {static_cast<double>(counters.launches),
                          static_cast<double>(counters.device_bytes_read + counters.device_bytes_written),
                          static_cast<double>(counters.flops)};
    }
    run.peak_bytes = metrics.peak_mem_bytes;
  });
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

bool is_tiled_attention(const std::string& name) {
  return name.find("attention_forward") != std::string::npos || name.find("key_grads") != std::string::npos ||
         name.find("query_grads") != std::string::npos;
}

// The scaling model's basis functions at a shape (see the file comment).
std::vector<double> basis(const std::string& name, const Shape3& s) {
  const double l = static_cast<double>(s.layers), b = static_cast<double>(s.batch), t = static_cast<double>(s.seq);
  if (is_tiled_attention(name)) return {l, l * b * t, l * b * t * t};
  return {1.0, l, b * t, l * b * t, t};
}

// The launch model's basis: launches depend on the layers only.
std::vector<double> launch_basis(const Shape3& s) { return {1.0, static_cast<double>(s.layers)}; }

// Least squares by the normal equations (the bases are tiny and well scaled
// after dividing each column by its largest value), Gaussian elimination
// with partial pivoting.
std::vector<double> fit(const std::vector<std::vector<double>>& rows, const std::vector<double>& values) {
  const size_t n = rows.front().size();
  std::vector<double> scale(n, 0.0);
  for (const auto& row : rows)
    for (size_t j = 0; j < n; ++j) scale[j] = std::max(scale[j], std::abs(row[j]));
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) a[i][j] += rows[r][i] / scale[i] * rows[r][j] / scale[j];
      a[i][n] += rows[r][i] / scale[i] * values[r];
    }
  }
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r)
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    std::swap(a[col], a[pivot]);
    TESSERA_CHECK(std::abs(a[col][col]) > 1e-12, "gpt2_step_prediction: the runs do not determine the scaling model");
    for (size_t r = 0; r < n; ++r) {
      if (r == col) continue;
      const double factor = a[r][col] / a[col][col];
      for (size_t j = col; j <= n; ++j) a[r][j] -= factor * a[col][j];
    }
  }
  std::vector<double> coefficients(n);
  for (size_t i = 0; i < n; ++i) coefficients[i] = a[i][n] / a[i][i] / scale[i];
  return coefficients;
}

struct Model {
  std::map<std::string, std::array<std::vector<double>, 3>> coefficients;  // launches, bytes, flops

  Count predict(const std::string& name, const Shape3& shape) const {
    const auto& c = coefficients.at(name);
    Count out;
    double* fields[3] = {&out.launches, &out.bytes, &out.flops};
    for (int q = 0; q < 3; ++q) {
      const std::vector<double> x = q == 0 ? launch_basis(shape) : basis(name, shape);
      double value = 0;
      for (size_t i = 0; i < x.size(); ++i) value += c[q][i] * x[i];
      *fields[q] = std::max(0.0, value);
    }
    return out;
  }
};

Model fit_model(const std::vector<Run>& runs) {
  std::set<std::string> names;
  for (const Run& run : runs)
    for (const auto& [name, count] : run.counts) names.insert(name);
  Model model;
  for (const std::string& name : names) {
    std::vector<std::vector<double>> rows, launch_rows;
    std::array<std::vector<double>, 3> values;
    for (const Run& run : runs) {
      rows.push_back(basis(name, run.shape));
      launch_rows.push_back(launch_basis(run.shape));
      const auto found = run.counts.find(name);
      const Count count = found == run.counts.end() ? Count{} : found->second;
      values[0].push_back(count.launches);
      values[1].push_back(count.bytes);
      values[2].push_back(count.flops);
    }
    for (int q = 0; q < 3; ++q) model.coefficients[name][q] = fit(q == 0 ? launch_rows : rows, values[q]);
  }
  return model;
}

// FLOPs of kernels the simulator does not count (it counts cublasLtMatmul's):
// the attention kernels from their shapes, as they compute on CUDA cores, per
// visible (query, key) pair: forward 4 D (q.k and p v), key grads 8 D (s, dp,
// dv, dk), query grads 6 D (s, dp, dq); row dots 2 D per row. Every other
// kernel is elementwise or a row pass: a generous 4 FLOPs per 4 bytes moved
// (GELU's tanh and Philox dropout do more per element, still far below the
// 20 FLOP/byte where a kernel would stop being memory-bound).
double shape_flops(const std::string& name, const Shape3& s) {
  const double pairs = static_cast<double>(s.layers * s.batch * kHeads) * static_cast<double>(s.seq) *
                       static_cast<double>(s.seq + 1) / 2;
  if (name.find("attention_forward") != std::string::npos) return 4.0 * kHeadDim * pairs;
  if (name.find("key_grads") != std::string::npos) return 8.0 * kHeadDim * pairs;
  if (name.find("query_grads") != std::string::npos) return 6.0 * kHeadDim * pairs;
  if (name.find("row_dots") != std::string::npos)
    return 2.0 * kHeadDim * static_cast<double>(s.layers * s.batch * kHeads * s.seq);
  return -1;  // no shape formula: bytes-based estimate
}

bool is_gemm(const std::string& name) { return name == "cublasLtMatmul"; }

struct KernelPrediction {
  std::string name;
  Count count;
  double ideal_bytes = 0;  // the bytes the kernel's operands need, where known; else 0 (the ratio is not known here)
  double seconds = 0;      // roofline, without launch overhead
  double bound_seconds = 0;
  bool compute_bound = false;
};

KernelPrediction predict_kernel(const std::string& name, Count count, const Shape3& s) {
  const double shaped = shape_flops(name, s);
  if (!is_gemm(name)) count.flops = shaped >= 0 ? shaped : count.bytes;
  KernelPrediction p{name, count, 0, 0, 0, false};
  // Ideal bytes of the tiled attention kernels: each operand read once, each
  // output written once (bf16 [B, H, T, D] tensors, f32 logsumexp and row
  // dots): forward q, k, v in, out and lse out; key grads q, k, v, dout,
  // lse, delta in, dk, dv out; query grads q, k, v, dout, lse, delta in, dq out.
  const double elements = static_cast<double>(s.layers * s.batch * kHeads * s.seq * kHeadDim);
  const double rows = static_cast<double>(s.layers * s.batch * kHeads * s.seq);
  if (name.find("attention_forward") != std::string::npos) p.ideal_bytes = 2 * 4 * elements + 4 * rows;
  if (name.find("key_grads") != std::string::npos) p.ideal_bytes = 2 * 6 * elements + 8 * rows;
  if (name.find("query_grads") != std::string::npos) p.ideal_bytes = 2 * 5 * elements + 8 * rows;
  const double peak = is_gemm(name) ? kBf16TensorFlopsPerSecond : kF32FlopsPerSecond;
  const auto roofline = [&](double bytes) { return std::max(bytes / kHbmBytesPerSecond, count.flops / peak); };
  p.seconds = roofline(count.bytes);
  p.bound_seconds = roofline(p.ideal_bytes > 0 ? p.ideal_bytes : count.bytes);
  p.compute_bound = count.flops / peak > count.bytes / kHbmBytesPerSecond;
  return p;
}

std::string shape_text(const Shape3& s) { return fmt::format("L={} B={} T={}", s.layers, s.batch, s.seq); }

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"PREDICTED H100 time per GPT-2 124M bf16 training step, from simulator-counted bytes and FLOPs"};
  int top = 12;
  std::string save_path, load_path;
  app.add_option("--top", top, "kernels listed per batch size")->check(CLI::PositiveNumber);
  app.add_option("--save-counts", save_path, "write the six runs' per-kernel counts here (tab-separated)");
  app.add_option("--load-counts", load_path, "analyse counts saved by --save-counts instead of simulating");
  CLI11_PARSE(app, argc, argv);

  fmt::print("# gpt2_step_prediction: cpu={} ({} cores, load {}); simulated cuda device, FSDP one rank, "
             "param_dtype bf16\n",
             bench::cpu_model(), std::thread::hardware_concurrency(), bench::load_average());
  fmt::print("# GPT-2 124M widths (C 768, 12 heads x 64, vocab 50257, wpe 1024); reduced L, B, T counted, then "
             "scaled (see the source's scaling model)\n\n");

  // Five runs fit the model (five unknowns for most kernels, two for the
  // tiled attention ones); the sixth, larger in L, B and T at once, checks it.
  // --save-counts keeps the six runs' counts (tab-separated) so that
  // --load-counts can redo the analysis without the simulator.
  const std::vector<Shape3> fit_shapes = {{1, 1, 64}, {2, 1, 64}, {1, 2, 64}, {1, 1, 128}, {2, 2, 128}};
  const Shape3 check_shape{3, 2, 96};
  checkpoint::FileRoles roles;
  if (!load_path.empty()) roles.add_input("--load-counts", load_path);
  if (!save_path.empty()) roles.add_output("--save-counts", save_path);
  roles.check();
  checkpoint::refuse_existing_output("--save-counts", save_path, "remove it or choose another path");
  std::vector<Run> loaded;
  if (!load_path.empty()) {
    std::ifstream in(load_path);
    TESSERA_CHECK(in.good(), "gpt2_step_prediction: cannot read {}", load_path);
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> fields;
      std::stringstream split(line);
      for (std::string field; std::getline(split, field, '\t');) fields.push_back(field);
      TESSERA_CHECK(fields.size() == 8, "gpt2_step_prediction: {}: malformed line '{}'", load_path, line);
      const Shape3 shape{std::stoll(fields[0]), std::stoll(fields[1]), std::stoll(fields[2])};
      if (loaded.empty() || loaded.back().shape.layers != shape.layers || loaded.back().shape.batch != shape.batch ||
          loaded.back().shape.seq != shape.seq) {
        loaded.push_back({shape, {}, std::stoll(fields[3]), 0});
      }
      loaded.back().counts[fields[4]] = {std::stod(fields[5]), std::stod(fields[6]), std::stod(fields[7])};
    }
    TESSERA_CHECK(loaded.size() == fit_shapes.size() + 1, "gpt2_step_prediction: {} holds {} runs, not {}", load_path,
                  loaded.size(), fit_shapes.size() + 1);
  }
  std::ofstream save;
  if (!save_path.empty()) save.open(save_path);
  const auto counted = [&](const Shape3& shape, size_t index) {
    Run run = loaded.empty() ? count_step(shape) : loaded[index];
    if (save.is_open()) {
      for (const auto& [name, c] : run.counts) {
        save << shape.layers << '\t' << shape.batch << '\t' << shape.seq << '\t' << run.peak_bytes << '\t' << name
             << '\t' << fmt::format("{:.0f}\t{:.0f}\t{:.0f}", c.launches, c.bytes, c.flops) << '\n';
      }
      save.flush();
    }
    return run;
  };
  std::vector<Run> runs;
  for (const Shape3& shape : fit_shapes) {
    runs.push_back(counted(shape, runs.size()));
    fmt::print("counted {:<16} {:4} kernel names, {:6} launches, {:8.3f} GB moved, peak {:7.1f} MiB ({:.0f} s on the "
               "simulator)\n",
               shape_text(shape), runs.back().counts.size(), [&] {
                 double n = 0;
                 for (const auto& [name, c] : runs.back().counts) n += c.launches;
                 return n;
               }(),
               [&] {
                 double n = 0;
                 for (const auto& [name, c] : runs.back().counts) n += c.bytes;
                 return n / 1e9;
               }(),
               static_cast<double>(runs.back().peak_bytes) / (1 << 20), runs.back().seconds);
    std::fflush(stdout);
  }
  const Model model = fit_model(runs);

  // The check: predict the held-out run from the five, per kernel and in total.
  const Run check = counted(check_shape, fit_shapes.size());
  fmt::print("\nscaling model check: {} counted, predicted from the five runs above\n", shape_text(check_shape));
  fmt::print("  {:<58} {:>14} {:>14} {:>8}\n", "kernel", "counted bytes", "predicted", "error");
  double counted_total = 0, predicted_total = 0, counted_flops = 0, predicted_flops = 0, worst = 0;
  double counted_launches = 0, predicted_launches = 0;
  for (const auto& [name, count] : check.counts) {
    const Count predicted = model.coefficients.count(name) ? model.predict(name, check_shape) : Count{};
    const double error = count.bytes > 0 ? predicted.bytes / count.bytes - 1 : 0;
    fmt::print("  {:<58} {:>14.0f} {:>14.0f} {:>+7.3f}%\n", name.substr(0, 58), count.bytes, predicted.bytes,
               100 * error);
    counted_total += count.bytes;
    predicted_total += predicted.bytes;
    counted_flops += count.flops;
    predicted_flops += predicted.flops;
    counted_launches += count.launches;
    predicted_launches += predicted.launches;
    worst = std::max(worst, std::abs(error));
  }
  fmt::print("  total bytes {:.0f} counted, {:.0f} predicted ({:+.3f}%); GEMM FLOPs {:+.3f}%; launches {:.0f} / {:.0f}; "
             "worst kernel {:.3f}%\n",
             counted_total, predicted_total, 100 * (predicted_total / counted_total - 1),
             100 * (predicted_flops / counted_flops - 1), counted_launches, predicted_launches, 100 * worst);

  // The prediction at GPT-2 124M's full shape.
  fmt::print("\n==== PREDICTED (not measured) H100 SXM, GPT-2 124M, 12 layers, bf16 params (f32 master weights and "
             "AdamW state), T=1024 ====\n");
  fmt::print("roofline per kernel: max(bytes / 3.35 TB/s, FLOPs / peak); GEMMs at 989 TFLOP/s (bf16 tensor cores), "
             "every other kernel at 67 TFLOP/s (CUDA cores; attention uses no tensor cores); launch overhead "
             "{:.0f} us per launch shown separately\n",
             kLaunchSeconds * 1e6);
  const nn::GPTConfig gpt2 = nn::GPTConfig::preset("gpt2-124m");
  double last_tokens_per_second = 0;  // B=64's, for the llm.c comparison
  for (const int64_t batch : {16, 32, 64}) {
    const Shape3 full{12, batch, 1024};
    std::vector<KernelPrediction> kernels;
    double seconds = 0, launches = 0, bound = 0, bytes = 0, gemm_flops = 0, attention_flops = 0;
    for (const auto& [name, c] : model.coefficients) {
      const KernelPrediction p = predict_kernel(name, model.predict(name, full), full);
      if (p.count.launches < 0.5) continue;
      kernels.push_back(p);
      seconds += p.seconds;
      bound += p.bound_seconds;
      launches += p.count.launches;
      bytes += p.count.bytes;
      if (is_gemm(name)) gemm_flops += p.count.flops;
      if (is_tiled_attention(name)) attention_flops += p.count.flops;
    }
    const double tokens = static_cast<double>(batch * 1024);
    const double step = seconds + launches * kLaunchSeconds;
    // MFU the way llm.c and nanoGPT count it: 6 N + 12 L T C per token (N
    // without wpe; the attention term counts the full T x T, as they do).
    const double model_flops = gpt2.flops_per_token(1024) * tokens;
    gpt::TrainConfig plan_config = gpt2_config(full);
    const gpt::RankMemoryEstimate plan = gpt::estimate_rank_memory(plan_config);
    fmt::print("\n-- PREDICTED B={} T=1024 ({:.0f} tokens/step) --\n", batch, tokens);
    fmt::print("  step time     {:8.2f} ms  (kernels {:.2f} ms + {:.0f} launches x {:.0f} us = {:.2f} ms); "
               "without launch overhead {:.2f} ms\n",
               step * 1e3, seconds * 1e3, launches, kLaunchSeconds * 1e6, launches * kLaunchSeconds * 1e3,
               seconds * 1e3);
    fmt::print("  tokens/s      {:8.0f}  (without launch overhead {:.0f})\n", tokens / step, tokens / seconds);
    last_tokens_per_second = tokens / step;
    fmt::print("  MFU           {:7.1f} %  ((6 N + 12 L T C) x tokens = {:.1f} TFLOP per step, against 989 TFLOP/s; "
               "without launch overhead {:.1f} %)\n",
               100 * model_flops / step / kBf16TensorFlopsPerSecond, model_flops / 1e12,
               100 * model_flops / seconds / kBf16TensorFlopsPerSecond);
    fmt::print("  counted work  GEMMs {:.1f} TFLOP ({:.2f} ms at peak), causal attention {:.2f} TFLOP on CUDA cores "
               "({:.2f} ms at 67 TFLOP/s), {:.1f} GB moved by all kernels\n",
               gemm_flops / 1e12, gemm_flops / kBf16TensorFlopsPerSecond * 1e3, attention_flops / 1e12,
               attention_flops / kF32FlopsPerSecond * 1e3, bytes / 1e9);
    fmt::print("  bound         {:8.2f} ms if every kernel moved its ideal bytes\n", bound * 1e3);
    fmt::print("  peak memory   {:8.2f} GiB per the plan (gpt::estimate_rank_memory: sharded state {:.2f}, gathered "
               "params {:.2f}, gathered grads {:.2f}, activations {:.2f}); an H100 has 80 GB\n",
               gib(static_cast<double>(plan.per_rank())), gib(static_cast<double>(plan.sharded_state)),
               gib(static_cast<double>(plan.gathered_parameters)), gib(static_cast<double>(plan.gathered_gradients)),
               gib(static_cast<double>(plan.activations)));
    std::sort(kernels.begin(), kernels.end(),
              [](const auto& a, const auto& b) { return a.seconds + a.count.launches * kLaunchSeconds >
                                                        b.seconds + b.count.launches * kLaunchSeconds; });
    fmt::print("  {:<52} {:>7} {:>10} {:>10} {:>9} {:>7} {:>6} {:>9} {:>4}\n", "top kernels by predicted time",
               "launch", "GB", "GFLOP", "ms", "% step", "bound", "bytes/id", "flag");
    const auto row = [&](const KernelPrediction& p) {
      const double ratio = p.ideal_bytes > 0 ? p.count.bytes / p.ideal_bytes : 0;
      fmt::print("  {:<52} {:>7.0f} {:>10.3f} {:>10.1f} {:>9.3f} {:>6.1f}% {:>6} {:>9} {:>4}\n",
                 p.name.substr(0, 52), p.count.launches, p.count.bytes / 1e9, p.count.flops / 1e9,
                 (p.seconds + p.count.launches * kLaunchSeconds) * 1e3,
                 100 * (p.seconds + p.count.launches * kLaunchSeconds) / step, p.compute_bound ? "FLOP" : "bytes",
                 ratio > 0 ? fmt::format("{:.3f}", ratio) : std::string("-"), !p.compute_bound && ratio > 1.1 ? ">1.1" : "");
    };
    for (int i = 0; i < std::min<int>(top, static_cast<int>(kernels.size())); ++i) row(kernels[static_cast<size_t>(i)]);
    std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) {
      return a.seconds / a.bound_seconds > b.seconds / b.bound_seconds;
    });
    fmt::print("  furthest from their bound (predicted / bound time; bound = ideal bytes at the same FLOPs):\n");
    for (int i = 0; i < std::min<int>(5, static_cast<int>(kernels.size())); ++i) {
      const KernelPrediction& p = kernels[static_cast<size_t>(i)];
      fmt::print("    {:<52} {:.3f}x its bound ({:.3f} ms against {:.3f} ms; {:.3f}x its ideal bytes)\n",
                 p.name.substr(0, 52), p.seconds / p.bound_seconds, p.seconds * 1e3, p.bound_seconds * 1e3,
                 p.ideal_bytes > 0 ? p.count.bytes / p.ideal_bytes : 1.0);
    }
    int flagged = 0;
    for (const auto& p : kernels) flagged += !p.compute_bound && p.ideal_bytes > 0 && p.count.bytes > 1.1 * p.ideal_bytes;
    fmt::print("  memory-bound kernels above 1.1x their ideal bytes: {}\n", flagged);
  }
  // llm.c's published GPT-2 124M runs (measured on real GPUs; per-GPU rates
  // derived here from the published totals: 10B tokens in the wall time):
  // Discussion #481 (github.com/karpathy/llm.c/discussions/481, May 2024):
  // 10B FineWeb tokens on 8x A100 80GB SXM in ~90 minutes, "up to ~60% model
  // flops utilization"; the modded-nanogpt README
  // (github.com/KellerJordan/modded-nanogpt) states that replication's
  // baseline on 8x H100 as 45 minutes. B=64, T=1024 per GPU, bf16, cuDNN
  // flash attention.
  const double llmc_h100 = 10e9 / (45 * 60) / 8, llmc_a100 = 10e9 / (90 * 60) / 8;
  const double llmc_h100_mfu = gpt2.flops_per_token(1024) * llmc_h100 / kBf16TensorFlopsPerSecond;
  fmt::print("\nllm.c, for comparison (PUBLISHED and measured, not predicted; per GPU, derived from 10B tokens in the "
             "published wall time):\n");
  fmt::print("  8x H100, 45 min (modded-nanogpt README, the llm.c GPT-2 124M baseline): {:.0f} tokens/s per H100, "
             "MFU {:.1f} % by the same formula\n",
             llmc_h100, 100 * llmc_h100_mfu);
  fmt::print("  8x A100 80GB, ~90 min (llm.c discussion #481): {:.0f} tokens/s per A100 (~60 % MFU of the A100's 312 "
             "TFLOP/s, as published)\n",
             llmc_a100);
  fmt::print("  the PREDICTED B=64 rate above against llm.c's H100 rate: {:.2f}x\n", last_tokens_per_second / llmc_h100);
  return 0;
}

// Bad input (a malformed --load-counts file, clashing paths) is a message, never an abort.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "gpt2_step_prediction: error: {}\n", error.what());
    return 1;
  }
}
