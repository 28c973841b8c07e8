// bench/gpt2_step_prediction: a PREDICTED H100 SXM time per training step of
// GPT-2 124M in bf16 (B = 16, 32, 64; T = 1024), from what the simulator counts.
//
// It runs real training steps (tessera::train::Trainer, FSDP over one rank with
// param_dtype bf16: the code path of `train --device cuda --param-dtype bf16`)
// on the simulated cuda device, at GPT-2 124M's exact widths (C 768, 12 heads
// of 64, vocab 50257 padded to 50304 rows, wpe 1024 rows) but with fewer layers and shorter, smaller
// batches: the CPU cannot simulate B = 16, T = 1024, 12 layers. Each kernel's
// launches, device bytes, shared-memory bytes and FLOPs are then scaled with
// an explicit model, fitted per kernel name over five reduced runs and checked
// on a sixth:
//
//   count(L, B, T) = c1 + cL L + cBT B T + cLBT L B T + cT T          (every kernel but attention's)
//   count(L, B, T) = aL L + aLBT L B T + aLBT2 L B T^2                (attention's tiled kernels)
//
// - L B T: a layer's GEMMs, elementwise, norm, dropout kernels are linear in
//   the rows they see; B T alone: embeddings, final norm, the tied head's
//   GEMMs (50304 columns) and the fused cross-entropy over 50257 of them;
// - L and 1: per-step work on parameters (AdamW, the gradient norm, zeroing
//   and casting gradients, FSDP's bf16 parameter copies): per layer, and for
//   wte, wpe and ln_f;
// - T: the position embedding's rows (its gradient touches T of wpe's rows);
// - L B T^2: the causal attention's tiling. An owned tile of 32 queries (64
//   on tensor cores) streams every key tile of that size up to the diagonal,
//   so per head k and v are read (T / 32 + 1) / 2 times (bytes: L B T and
//   L B T^2 terms, exact for T a multiple of the tile), and the visible
//   (query, key) pairs are T (T + 1) / 2; shared-memory bytes follow the same
//   two terms (staged tiles, and the inner loops' loads per tile pair).
//
// Launches do not grow with B or T (grid-stride loops cover any size), only
// with L: launches(L) = c1 + cL L per kernel, a least-squares fit over the
// five runs. (Fitting them like bytes let a small run's choice of a packed
// or an element-wise kernel variant extrapolate to thousands of launches.)
//
// Prediction per kernel: bench/gpu_roofline.h's model of an H100 SXM, every
// figure with its source and an efficiency below 100%: the largest of HBM
// bytes, shared-memory bytes and FLOPs (tensor cores for cublasLtMatmul at
// the efficiency of GPT-2's GEMM shapes, and for attention_mma.cu's kernels
// at an assumed flash-attention efficiency; CUDA cores without FMA for every
// other kernel, attention.cu's included), plus a launch overhead; kernels run
// one after another on one stream.
// --calibration FILE replaces assumed figures with measured ones. A paper
// estimate: caches, clocks, overlap between kernels are not in it.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu_roofline.h"
#include "bench/machine_context.h"
#include "tensor/cuda/attention_mma.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/stream.h"
#include "train/file_roles.h"
#include "train/resource_limits.h"
#include "train/trainer.h"

using namespace tessera;
namespace sim = tessera::cuda::sim;

namespace {

constexpr int64_t kHeadDim = 64, kHeads = 12;
const Device kCuda(DeviceType::cuda);

// llm.c's GPT-2 124M training on 8 x H100 SXM: about 140 ms per step of
// 524,288 tokens (B = 64, T = 1024 per GPU; the figure issue 28 compares
// against). The modded-nanogpt README's llm.c baseline, 10B tokens in 45
// minutes on 8 x H100, gives 463 k tokens/s per GPU: within 1% of it.
constexpr double kLlmcStepSeconds = 0.140, kLlmcStepTokens = 524288, kLlmcGpus = 8;
constexpr double kLlmcTokensPerSecond = kLlmcStepTokens / kLlmcStepSeconds / kLlmcGpus;

struct Shape3 {
  int64_t layers, batch, seq;
};

// What one kernel name did in one counted step.
struct Count {
  double launches = 0, bytes = 0, shared_bytes = 0, flops = 0;
};
using StepCounts = std::map<std::string, Count>;

struct Run {
  Shape3 shape;
  StepCounts counts;
  int64_t peak_bytes = 0;
  double seconds = 0;
};

tessera::train::TrainConfig gpt2_config(const Shape3& shape) {
  tessera::train::TrainConfig config;
  config.preset = "gpt2-124m";
  config.model = nn::GPTConfig::preset("gpt2-124m");
  config.model.n_layer = shape.layers;
  config.seq_len = shape.seq;
  config.batch = shape.batch;
  config.grad_accum = 1;
  config.steps = 2;
  config.lr = 6e-4;
  config.warmup = 0;
  config.data = tessera::train::kSyntheticData;
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
  const tessera::train::TrainConfig config = gpt2_config(shape);
  const auto start = std::chrono::steady_clock::now();
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
    trainer.train_step();
    current_stream(kCuda)->synchronize();
    sim::reset_kernel_counters();
    const tessera::train::StepMetrics metrics = trainer.train_step();
    current_stream(kCuda)->synchronize();
    for (const auto& [name, counters] : sim::kernel_counters()) {
      run.counts[name] = {static_cast<double>(counters.launches),
                          static_cast<double>(counters.device_bytes_read + counters.device_bytes_written),
                          static_cast<double>(counters.shared_bytes_accessed), static_cast<double>(counters.flops)};
    }
    run.peak_bytes = metrics.peak_mem_bytes;
  });
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

// The counts file: a header naming the columns, then one line per run and
// kernel name, tab-separated.
constexpr std::array<const char*, 9> kCountColumns = {"layers",   "batch",        "seq",   "peak_bytes", "kernel",
                                                      "launches", "device_bytes", "shared_bytes", "flops"};

void save_counts(std::ostream& out, const Run& run) {
  for (const auto& [name, c] : run.counts) {
    out << fmt::format("{}\t{}\t{}\t{}\t{}\t{:.0f}\t{:.0f}\t{:.0f}\t{:.0f}\n", run.shape.layers, run.shape.batch,
                       run.shape.seq, run.peak_bytes, name, c.launches, c.bytes, c.shared_bytes, c.flops);
  }
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream split(line);
  for (std::string field; std::getline(split, field, '\t');) fields.push_back(field);
  return fields;
}

// Runs in the order they were saved. A file without a column (one written
// before shared-memory bytes were counted) is refused, naming it: reading it
// as 0 would predict attention without its binding bound.
std::vector<Run> load_counts(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "gpt2_step_prediction: cannot read {}", path);
  std::string line;
  TESSERA_CHECK(std::getline(in, line), "gpt2_step_prediction: {} is empty", path);
  TESSERA_CHECK(line.starts_with("# "),
                "gpt2_step_prediction: {}: no header line naming the columns, so no 'shared_bytes' column: a file "
                "from before shared-memory bytes were counted; count again with --save-counts",
                path);
  const std::vector<std::string> header = split_tabs(line.substr(2));
  std::array<size_t, kCountColumns.size()> column{};
  for (size_t i = 0; i < kCountColumns.size(); ++i) {
    const auto found = std::find(header.begin(), header.end(), kCountColumns[i]);
    TESSERA_CHECK(found != header.end(), "gpt2_step_prediction: {}: the header has no '{}' column (it has: {}); count "
                  "again with --save-counts", path, kCountColumns[i], line.substr(2));
    column[i] = static_cast<size_t>(found - header.begin());
  }
  std::vector<Run> runs;
  for (int number = 2; std::getline(in, line); ++number) {
    const std::vector<std::string> f = split_tabs(line);
    TESSERA_CHECK(f.size() == header.size(), "gpt2_step_prediction: {} line {}: {} fields, the header names {}: '{}'",
                  path, number, f.size(), header.size(), line);
    try {
      const Shape3 shape{std::stoll(f[column[0]]), std::stoll(f[column[1]]), std::stoll(f[column[2]])};
      if (runs.empty() || runs.back().shape.layers != shape.layers || runs.back().shape.batch != shape.batch ||
          runs.back().shape.seq != shape.seq) {
        runs.push_back({shape, {}, std::stoll(f[column[3]]), 0});
      }
      runs.back().counts[f[column[4]]] = {std::stod(f[column[5]]), std::stod(f[column[6]]), std::stod(f[column[7]]),
                                          std::stod(f[column[8]])};
    } catch (const std::logic_error&) {
      tessera::fail("gpt2_step_prediction: {} line {}: a number does not parse: '{}'", path, number, line);
    }
  }
  return runs;
}

// The tiled attention kernels: attention.cu's on CUDA cores
// (attention_forward_kernel, ...) and attention_mma.cu's on tensor cores
// (attention_mma_forward_kernel, ...), which bf16 at head dim 64 takes.
enum class AttentionPart { none, forward, key_grads, query_grads };

AttentionPart attention_part(const std::string& name) {
  if (name.find("attention") == std::string::npos) return AttentionPart::none;
  if (name.find("forward") != std::string::npos) return AttentionPart::forward;
  if (name.find("key_grads") != std::string::npos) return AttentionPart::key_grads;
  if (name.find("query_grads") != std::string::npos) return AttentionPart::query_grads;
  return AttentionPart::none;
}

bool is_tiled_attention(const std::string& name) { return attention_part(name) != AttentionPart::none; }

bool is_attention_on_tensor_cores(const std::string& name) {
  return is_tiled_attention(name) && name.find("mma") != std::string::npos;
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

// The four fitted quantities of a Count, in one order.
constexpr int kQuantities = 4;  // launches, bytes, shared bytes, flops
double& quantity(Count& c, int q) {
  double* fields[kQuantities] = {&c.launches, &c.bytes, &c.shared_bytes, &c.flops};
  return *fields[q];
}
double quantity(const Count& c, int q) {
  const std::array<double, kQuantities> values = {c.launches, c.bytes, c.shared_bytes, c.flops};
  return values[static_cast<size_t>(q)];
}

struct Model {
  std::map<std::string, std::array<std::vector<double>, kQuantities>> coefficients;

  Count predict(const std::string& name, const Shape3& shape) const {
    const auto& c = coefficients.at(name);
    Count out;
    for (int q = 0; q < kQuantities; ++q) {
      const std::vector<double> x = q == 0 ? launch_basis(shape) : basis(name, shape);
      double value = 0;
      for (size_t i = 0; i < x.size(); ++i) value += c[q][i] * x[i];
      quantity(out, q) = std::max(0.0, value);
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
    std::array<std::vector<double>, kQuantities> values;
    for (const Run& run : runs) {
      rows.push_back(basis(name, run.shape));
      launch_rows.push_back(launch_basis(run.shape));
      const auto found = run.counts.find(name);
      Count count = found == run.counts.end() ? Count{} : found->second;
      for (int q = 0; q < kQuantities; ++q) values[q].push_back(quantity(count, q));
    }
    for (int q = 0; q < kQuantities; ++q) model.coefficients[name][q] = fit(q == 0 ? launch_rows : rows, values[q]);
  }
  return model;
}

// Visible (query, key) pairs of the causal attention over a step's layers, batch and heads.
double visible_pairs(const Shape3& s) {
  return static_cast<double>(s.layers * s.batch * kHeads) * static_cast<double>(s.seq) *
         static_cast<double>(s.seq + 1) / 2;
}

// FLOPs of kernels the simulator does not count (it counts cublasLtMatmul's
// and, where it counts mma.sync, the tensor-core attention's):
// the attention kernels from their shapes, per visible (query, key) pair:
// forward 4 D (q.k and p v), key grads 8 D (s, dp, dv, dk), query grads 6 D
// (s, dp, dq) on CUDA cores and 2 D (dq) on tensor cores, where the key
// grads hand dS over; row dots 2 D per row. On CUDA cores a multiply and an add are
// 2 FLOPs and, built with -fmad=false, 2 instructions; on tensor cores the
// diagonal tiles' masked half is work too, left out here (3% at T = 1024 in
// tiles of 64). Every other kernel is elementwise or a row pass: a generous
// 1 FLOP per byte moved (GELU's tanh and Philox dropout do more per element,
// still far below the ~8 FLOP/byte where a kernel would leave the HBM bound
// in this model).
double shape_flops(const std::string& name, const Shape3& s) {
  switch (attention_part(name)) {
    case AttentionPart::forward: return 4.0 * kHeadDim * visible_pairs(s);
    case AttentionPart::key_grads: return 8.0 * kHeadDim * visible_pairs(s);
    case AttentionPart::query_grads:
      return (is_attention_on_tensor_cores(name) ? 2.0 : 6.0) * kHeadDim * visible_pairs(s);
    case AttentionPart::none: break;
  }
  if (name.find("row_dots") != std::string::npos)
    return 2.0 * kHeadDim * static_cast<double>(s.layers * s.batch * kHeads * s.seq);
  return -1;  // no shape formula: bytes-based estimate
}

bool is_gemm(const std::string& name) { return name == "cublasLtMatmul"; }

// GPT-2's GEMMs in one training step, C[m, n] = A[m, k] B[k, n] with M = B T
// rows: per layer the qkv, attention projection, MLP up and down
// projections, and the tied head once; each forward (M, out, in), its input
// gradient (M, in, out) and its weight gradient (out, in, M).
std::vector<bench::GemmCalls> gpt2_gemms(const nn::GPTConfig& config, const Shape3& s) {
  const int64_t rows = s.batch * s.seq, c = config.n_embd;
  const double layers = static_cast<double>(s.layers);
  std::vector<bench::GemmCalls> gemms;
  const auto linear = [&](int64_t in, int64_t out, double count) {
    gemms.push_back({{rows, out, in}, count});
    gemms.push_back({{rows, in, out}, count});
    gemms.push_back({{out, in, rows}, count});
  };
  linear(c, 3 * c, layers);
  linear(c, c, layers);
  linear(c, 4 * c, layers);
  linear(4 * c, c, layers);
  linear(c, config.padded_vocab_size(), 1);
  return gemms;
}

double gemm_flops(const std::vector<bench::GemmCalls>& gemms) {
  double flops = 0;
  for (const auto& g : gemms)
    flops += 2.0 * static_cast<double>(g.shape.m) * static_cast<double>(g.shape.n) * static_cast<double>(g.shape.k) *
             g.calls;
  return flops;
}

// The bytes the tiled attention kernels' operands need, each read once and
// each output written once (bf16 [B, H, T, D] tensors, f32 logsumexp and row
// dots): forward q, k, v in, out and lse out; key grads q, k, v, dout, lse,
// delta in, dk, dv out; query grads q, k, v, dout, lse, delta in, dq out. On
// tensor cores the key grads also write bf16 dS of the causal 64 x 64 tiles,
// and the query grads read it and k only. 0 where not known.
double ideal_bytes(const std::string& name, const Shape3& s) {
  const double elements = static_cast<double>(s.layers * s.batch * kHeads * s.seq * kHeadDim);
  const double rows = static_cast<double>(s.layers * s.batch * kHeads * s.seq);
  const int64_t tile = cuda::kAttentionMmaTile;
  const double tiles = static_cast<double>((s.seq + tile - 1) / tile);
  const double score_grads =
      static_cast<double>(s.layers * s.batch * kHeads) * tiles * (tiles + 1) / 2 * static_cast<double>(tile * tile * 2);
  const bool mma = is_attention_on_tensor_cores(name);
  switch (attention_part(name)) {
    case AttentionPart::forward: return 2 * 4 * elements + 4 * rows;
    case AttentionPart::key_grads: return 2 * 6 * elements + 8 * rows + (mma ? score_grads : 0);
    case AttentionPart::query_grads: return mma ? 2 * 2 * elements + score_grads : 2 * 5 * elements + 8 * rows;
    case AttentionPart::none: break;
  }
  return 0;
}

bench::KernelWork kernel_work(const std::string& name, const Count& count, const nn::GPTConfig& config,
                              const Shape3& s) {
  bench::KernelWork work;
  work.name = name;
  work.launches = count.launches;
  work.hbm_bytes = count.bytes;
  work.shared_bytes = count.shared_bytes;
  if (is_gemm(name)) {
    work.unit = bench::ComputeUnit::tensor_core_gemm;
    work.flops = count.flops;
    work.gemms = gpt2_gemms(config, s);
  } else if (is_attention_on_tensor_cores(name) && count.flops > 0) {
    // The simulator counts every mma.sync (4096 FLOPs per m16n8k16): the
    // work the tensor cores do, diagonal tiles' masked entries included.
    work.unit = bench::ComputeUnit::tensor_core_attention;
    work.flops = count.flops;
  } else {
    if (is_attention_on_tensor_cores(name)) work.unit = bench::ComputeUnit::tensor_core_attention;
    const double shaped = shape_flops(name, s);
    work.flops = shaped >= 0 ? shaped : count.bytes;
  }
  return work;
}

std::string shape_text(const Shape3& s) { return fmt::format("L={} B={} T={}", s.layers, s.batch, s.seq); }

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

double relative_error(double predicted, double counted) { return counted > 0 ? predicted / counted - 1 : 0; }

// llm.c's MFU count (train_gpt2.cu, gpt2_estimate_mfu): 6 N + 6 L C T FLOPs
// per token, N every parameter (wpe included, and the vocabulary padded to
// 50304 as llm.c pads it: num_parameters() counts the padding rows too).
double llmc_flops_per_token(const nn::GPTConfig& c, int64_t seq) {
  return 6.0 * static_cast<double>(c.num_parameters()) +
         6.0 * static_cast<double>(c.n_layer) * static_cast<double>(c.n_embd) * static_cast<double>(seq);
}

// The scaling model against the held-out run, per kernel and in total.
void print_check(const Model& model, const Run& check, const nn::GPTConfig& gpt2) {
  fmt::print("\nscaling model check: {} counted, predicted from the five runs above\n", shape_text(check.shape));
  fmt::print("  {:<58} {:>14} {:>9} {:>14} {:>9}\n", "kernel", "counted bytes", "error", "shared bytes", "error");
  Count counted_total, predicted_total;
  double worst = 0, worst_shared = 0;
  for (const auto& [name, count] : check.counts) {
    const Count predicted = model.coefficients.count(name) ? model.predict(name, check.shape) : Count{};
    const double error = relative_error(predicted.bytes, count.bytes);
    const double shared_error = relative_error(predicted.shared_bytes, count.shared_bytes);
    fmt::print("  {:<58} {:>14.0f} {:>+8.3f}% {:>14.0f} {:>+8.3f}%\n", name.substr(0, 58), count.bytes, 100 * error,
               count.shared_bytes, 100 * shared_error);
    for (int q = 0; q < kQuantities; ++q) {
      quantity(counted_total, q) += quantity(count, q);
      quantity(predicted_total, q) += quantity(predicted, q);
    }
    worst = std::max(worst, std::abs(error));
    worst_shared = std::max(worst_shared, std::abs(shared_error));
  }
  fmt::print("  total bytes {:+.3f}%, shared bytes {:+.3f}%, counted (tensor-core) FLOPs {:+.3f}%; launches {:.0f} / {:.0f}; worst "
             "kernel bytes {:.3f}%, shared bytes {:.3f}%\n",
             100 * relative_error(predicted_total.bytes, counted_total.bytes),
             100 * relative_error(predicted_total.shared_bytes, counted_total.shared_bytes),
             100 * relative_error(predicted_total.flops, counted_total.flops), counted_total.launches,
             predicted_total.launches, 100 * worst, 100 * worst_shared);
  const auto gemm = check.counts.find("cublasLtMatmul");
  if (gemm != check.counts.end()) {
    const double shapes = gemm_flops(gpt2_gemms(gpt2, check.shape));
    fmt::print("  GEMM shapes (per layer qkv, proj, fc, fc proj; the head; each forward, dX, dW): {:.0f} FLOPs, "
               "counted {:.0f} ({:+.3f}%)\n",
               shapes, gemm->second.flops, 100 * relative_error(shapes, gemm->second.flops));
  }
  for (const auto& [name, count] : check.counts) {
    if (is_tiled_attention(name)) {
      fmt::print("  {:<58} {:.1f} shared bytes per visible (query, key) pair; counted FLOPs {:.3f}x its shape's\n",
                 name.substr(0, 58), count.shared_bytes / visible_pairs(check.shape),
                 count.flops / shape_flops(name, check.shape));
    }
  }
}

// A step MEASURED on a GPU, kernel by kernel (bench/ncu_kernel_times.py
// writes it from an ncu profile): milliseconds and launches per kernel name
// as the simulator counts them.
struct MeasuredStep {
  std::string source;
  int64_t batch = 0, seq_len = 0;
  double total_ms = 0;
  std::map<std::string, std::pair<double, double>> kernels;  // name -> (ms, launches)
};

MeasuredStep load_measured(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "gpt2_step_prediction: --measured {}: cannot open it", path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("gpt2_step_prediction: --measured {}: not JSON ({})", path, e.what()));
  }
  MeasuredStep step;
  for (const char* field : {"source", "batch", "seq_len", "total_ms", "kernels"}) {
    TESSERA_CHECK(json.contains(field), "gpt2_step_prediction: --measured {}: no \"{}\" field", path, field);
  }
  try {
    step.source = json.at("source").get<std::string>();
    step.batch = json.at("batch").get<int64_t>();
    step.seq_len = json.at("seq_len").get<int64_t>();
    step.total_ms = json.at("total_ms").get<double>();
    for (const auto& [name, kernel] : json.at("kernels").items()) {
      step.kernels[name] = {kernel.at("ms").get<double>(), kernel.at("launches").get<double>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("gpt2_step_prediction: --measured {}: {}", path, e.what()));
  }
  TESSERA_CHECK(step.seq_len == 1024 && (step.batch == 16 || step.batch == 32 || step.batch == 64),
                "gpt2_step_prediction: --measured {}: B={} T={}; the prediction is for T=1024 and B=16, 32 or 64",
                path, step.batch, step.seq_len);
  return step;
}

// A kernel's function name, as ncu_kernel_times.py groups them:
// "(reduce_kernel<SumOp<T>, T, Out>)" -> "reduce_kernel".
std::string base_name(const std::string& name) {
  const size_t first = name.find_first_not_of('(');
  const size_t end = name.find_first_of("<(", first);
  return name.substr(first, end == std::string::npos ? std::string::npos : end - first);
}

// The prediction beside the measurement, kernel by kernel (by measured time),
// and the ratio of the totals: how far off the model is, and where.
void print_measured(const std::vector<bench::KernelPrediction>& kernels, double predicted_step,
                    const MeasuredStep& measured, int top) {
  std::map<std::string, std::pair<double, bench::Bound>> predicted;  // name -> (ms, bound of its largest part)
  std::map<std::string, double> largest;
  for (const bench::KernelPrediction& p : kernels) {
    const std::string name = base_name(p.work.name);
    predicted[name].first += p.seconds * 1e3;
    if (p.seconds > largest[name]) largest[name] = p.seconds, predicted[name].second = p.bound;
  }
  std::vector<std::pair<std::string, double>> by_time;
  for (const auto& [name, kernel] : measured.kernels) by_time.emplace_back(name, kernel.first);
  std::sort(by_time.begin(), by_time.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  fmt::print("\n  MEASURED against PREDICTED, B={}: {}\n", measured.batch, measured.source);
  fmt::print("  {:<40} {:>8} {:>10} {:>10} {:>9} {:>9}\n", "kernel (by measured time)", "launches", "MEAS ms",
             "PRED ms", "meas/pred", "bound");
  for (int i = 0; i < std::min<int>(top, static_cast<int>(by_time.size())); ++i) {
    const auto& [name, ms] = by_time[static_cast<size_t>(i)];
    const auto found = predicted.find(name);
    const double predicted_ms = found == predicted.end() ? 0.0 : found->second.first;
    fmt::print("  {:<40} {:>8.0f} {:>10.3f} {:>10.3f} {:>9} {:>9}\n", name.substr(0, 40),
               measured.kernels.at(name).second, ms, predicted_ms,
               predicted_ms > 0 ? fmt::format("{:.2f}", ms / predicted_ms) : std::string("-"),
               found == predicted.end() ? "-" : bench::bound_name(found->second.second));
  }
  fmt::print("  kernels' total: MEASURED {:.2f} ms, PREDICTED {:.2f} ms: measured / predicted {:.2f}\n",
             measured.total_ms, predicted_step * 1e3, measured.total_ms / (predicted_step * 1e3));
}

// One batch size's PREDICTED step: the summary, then the top kernels.
// Returns its tokens/s.
double print_prediction(const bench::GpuModel& gpu, const Model& model, const nn::GPTConfig& gpt2, int64_t batch,
                        int top, const MeasuredStep* measured, double& step_seconds) {
  const Shape3 full{gpt2.n_layer, batch, 1024};
  std::vector<bench::KernelPrediction> kernels;
  std::map<bench::Bound, double> by_bound;
  std::set<std::string> attention_units;
  double step = 0, launches = 0, launch_seconds = 0, bytes = 0, shared = 0;
  double gemm_flops_counted = 0, gemm_seconds = 0, attention_flops = 0, attention_seconds = 0, attention_pairs_bytes = 0;
  for (const auto& [name, coefficients] : model.coefficients) {
    const Count count = model.predict(name, full);
    if (count.launches < 0.5) continue;
    const bench::KernelPrediction p = bench::predict_kernel(gpu, kernel_work(name, count, gpt2, full));
    kernels.push_back(p);
    step += p.seconds;
    by_bound[p.bound] += p.seconds;
    launches += p.work.launches;
    launch_seconds += p.launch_seconds;
    bytes += p.work.hbm_bytes;
    shared += p.work.shared_bytes;
    if (is_gemm(name)) {
      gemm_flops_counted += p.work.flops;
      gemm_seconds += p.seconds;
    }
    if (is_tiled_attention(name)) {
      attention_units.insert(is_attention_on_tensor_cores(name) ? "tensor cores (mma.sync)" : "CUDA cores");
      attention_flops += p.work.flops;
      attention_seconds += p.seconds;
      attention_pairs_bytes += p.work.shared_bytes;
    }
  }
  const double tokens = static_cast<double>(batch * full.seq);
  const double tokens_per_second = tokens / step;
  const double model_flops = llmc_flops_per_token(gpt2, full.seq) * tokens;
  const double peak = gpu.tensor_flops_per_second.value;
  tessera::train::TrainConfig plan_config = gpt2_config(full);
  const tessera::train::RankMemoryEstimate plan = tessera::train::estimate_rank_memory(plan_config);
  const std::vector<bench::GemmCalls> gemms = gpt2_gemms(gpt2, full);
  const bench::KernelPrediction gemm_mix = bench::predict_kernel(
      gpu, {"gemms", bench::ComputeUnit::tensor_core_gemm, 0, 0, 0, gemm_flops(gemms), gemms});

  fmt::print("\n-- PREDICTED {} B={} T={} ({:.0f} tokens/step), GPT-2 124M bf16 --\n", gpu.name, batch, full.seq,
             tokens);
  fmt::print("  PREDICTED step time  {:8.2f} ms  (kernels one after another on one stream; of it {:.0f} launches x "
             "{:.0f} us = {:.2f} ms)\n",
             step * 1e3, launches, gpu.launch_seconds.value * 1e6, launch_seconds * 1e3);
  fmt::print("  PREDICTED tokens/s   {:8.0f}\n", tokens_per_second);
  fmt::print("  PREDICTED MFU        {:7.1f} %  (llm.c's count: (6 N + 6 L C T) x tokens = {:.1f} TFLOP per step, N = "
             "{:.1f} M every parameter; of {:.0f} TFLOP/s bf16 dense)\n",
             100 * model_flops / step / peak, model_flops / 1e12,
             static_cast<double>(gpt2.num_parameters()) / 1e6, peak / 1e12);
  fmt::print("  PREDICTED vs llm.c   {:8.2f} x  its {:.0f} tokens/s per H100 (8 x H100, {:.0f} ms per {:.0f}-token "
             "step, B=64 per GPU; measured, published)\n",
             tokens_per_second / kLlmcTokensPerSecond, kLlmcTokensPerSecond, kLlmcStepSeconds * 1e3,
             kLlmcStepTokens);
  std::string bounds;
  for (const auto& [bound, seconds] : by_bound)
    bounds += fmt::format("{}{} {:.2f} ms ({:.0f}%)", bounds.empty() ? "" : ", ", bench::bound_name(bound),
                          seconds * 1e3, 100 * seconds / step);
  fmt::print("  time by binding bound  {}\n", bounds);
  fmt::print("  GEMMs                {:.1f} TFLOP in {:.2f} ms: {:.0f} TFLOP/s effective ({:.0f}% of peak: the shape "
             "mix's efficiency {:.0f}%, plus launches)\n",
             gemm_flops_counted / 1e12, gemm_seconds * 1e3, gemm_flops_counted / gemm_seconds / 1e12,
             100 * gemm_flops_counted / gemm_seconds / peak, 100 * gemm_mix.compute_efficiency);
  fmt::print("  causal attention     {:.2f} TFLOP on {} in {:.2f} ms: {:.1f} TFLOP/s effective; {:.0f} shared bytes "
             "per visible pair over its three kernels\n",
             attention_flops / 1e12, fmt::join(attention_units, " and "), attention_seconds * 1e3,
             attention_flops / attention_seconds / 1e12, attention_pairs_bytes / visible_pairs(full));
  fmt::print("  moved                {:.1f} GB device memory, {:.1f} GB shared memory\n", bytes / 1e9, shared / 1e9);
  fmt::print("  peak memory          {:.2f} GiB per the plan (tessera::train::estimate_rank_memory: sharded state {:.2f}, "
             "gathered params {:.2f}, gathered grads {:.2f}, activations {:.2f}); an H100 has 80 GB\n",
             gib(static_cast<double>(plan.per_rank())), gib(static_cast<double>(plan.sharded_state)),
             gib(static_cast<double>(plan.gathered_parameters)), gib(static_cast<double>(plan.gathered_gradients)),
             gib(static_cast<double>(plan.activations)));

  std::sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  fmt::print("  {:<50} {:>6} {:>8} {:>8} {:>8} {:>9} {:>6} {:>9} {:>8} {:>8}\n", "top kernels by PREDICTED time",
             "launch", "HBM GB", "shr GB", "GFLOP", "PRED ms", "%step", "bound", "2nd/1st", "bytes/id");
  for (int i = 0; i < std::min<int>(top, static_cast<int>(kernels.size())); ++i) {
    const bench::KernelPrediction& p = kernels[static_cast<size_t>(i)];
    // How close the next bound is: the second largest of the three work terms over the largest.
    std::array<double, 3> terms = {p.hbm_seconds, p.shared_seconds, p.compute_seconds};
    std::sort(terms.begin(), terms.end());
    const double ideal = ideal_bytes(p.work.name, full);
    fmt::print("  {:<50} {:>6.0f} {:>8.3f} {:>8.3f} {:>8.1f} {:>9.3f} {:>5.1f}% {:>9} {:>8.2f} {:>8}\n",
               p.work.name.substr(0, 50), p.work.launches, p.work.hbm_bytes / 1e9, p.work.shared_bytes / 1e9,
               p.work.flops / 1e9, p.seconds * 1e3, 100 * p.seconds / step, bench::bound_name(p.bound),
               terms[2] > 0 ? terms[1] / terms[2] : 0.0,
               ideal > 0 ? fmt::format("{:.3f}", p.work.hbm_bytes / ideal) : std::string("-"));
  }
  fmt::print("  (2nd/1st: the second largest of a kernel's HBM, shared and compute times over the largest, near 1 when "
             "another bound is close; bytes/id: HBM bytes over its operands read once, attention's k and v are "
             "re-read by each query tile)\n");
  if (measured != nullptr && measured->batch == batch) print_measured(kernels, step, *measured, top);
  step_seconds = step;
  return tokens_per_second;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"PREDICTED H100 time per GPT-2 124M bf16 training step, from simulator-counted bytes and FLOPs"};
  int top = 12;
  std::string save_path, load_path, calibration_path, measured_path, prediction_path;
  app.add_option("--top", top, "kernels listed per batch size")->check(CLI::PositiveNumber);
  app.add_option("--save-counts", save_path, "write the six runs' per-kernel counts here (tab-separated)");
  app.add_option("--load-counts", load_path, "analyse counts saved by --save-counts instead of simulating");
  app.add_option("--calibration", calibration_path,
                 "JSON of figures measured on a GPU (HBM bytes/s, GEMM TFLOP/s per shape), replacing assumed ones");
  app.add_option("--measured", measured_path,
                 "JSON of a step's kernel times measured on a GPU (bench/ncu_kernel_times.py): printed beside the "
                 "prediction");
  app.add_option("--prediction-out", prediction_path,
                 "write the PREDICTED step times (ms per B) as JSON (tools/gpu_check.sh prints them beside its runs)");
  CLI11_PARSE(app, argc, argv);

  tessera::train::FileRoles roles;
  if (!load_path.empty()) roles.add_input("--load-counts", load_path);
  if (!calibration_path.empty()) roles.add_input("--calibration", calibration_path);
  if (!measured_path.empty()) roles.add_input("--measured", measured_path);
  if (!prediction_path.empty()) roles.add_output("--prediction-out", prediction_path);
  if (!save_path.empty()) roles.add_output("--save-counts", save_path);
  roles.check();
  tessera::train::refuse_existing_output("--save-counts", save_path, "remove it or choose another path");
  bench::GpuModel gpu = bench::h100_sxm();
  if (!calibration_path.empty()) bench::apply_calibration_file(gpu, calibration_path);
  std::optional<MeasuredStep> measured;
  if (!measured_path.empty()) measured = load_measured(measured_path);

  fmt::print("# gpt2_step_prediction: cpu={} ({} cores, load {}); simulated cuda device, FSDP one rank, "
             "param_dtype bf16\n",
             bench::cpu_model(), std::thread::hardware_concurrency(), bench::load_average());
  fmt::print("# GPT-2 124M widths (C 768, 12 heads x 64, vocab 50257 padded to 50304, wpe 1024); reduced L, B, T "
             "counted, then scaled (see the source's scaling model)\n\n");

  // Five runs fit the model (five unknowns for most kernels, three for the
  // tiled attention ones); the sixth, larger in L and T at once, checks it.
  // Every T is a multiple of both attention kernels' tiles (32 on CUDA
  // cores, 64 on tensor cores), where the tiling's terms are exact, and
  // every B T is at least a block (256): a reduction over the rows (the bias
  // gradients) gives each output min(B T, 256) threads, so below that its
  // shared-memory bytes are not linear in B T.
  const std::vector<Shape3> fit_shapes = {{1, 4, 64}, {2, 4, 64}, {1, 8, 64}, {1, 2, 128}, {2, 4, 128}};
  const Shape3 check_shape{3, 4, 192};
  std::vector<Run> loaded;
  if (!load_path.empty()) {
    loaded = load_counts(load_path);
    TESSERA_CHECK(loaded.size() == fit_shapes.size() + 1, "gpt2_step_prediction: {} holds {} runs, not {}", load_path,
                  loaded.size(), fit_shapes.size() + 1);
  }
  std::ofstream save;
  if (!save_path.empty()) {
    save.open(save_path);
    save << "# " << fmt::format("{}", fmt::join(kCountColumns, "\t")) << '\n';
  }
  const auto counted = [&](const Shape3& shape, size_t index) {
    Run run = loaded.empty() ? count_step(shape) : loaded[index];
    if (save.is_open()) {
      save_counts(save, run);
      save.flush();
    }
    return run;
  };
  std::vector<Run> runs;
  for (const Shape3& shape : fit_shapes) {
    runs.push_back(counted(shape, runs.size()));
    Count total;
    for (const auto& [name, c] : runs.back().counts)
      for (int q = 0; q < kQuantities; ++q) quantity(total, q) += quantity(c, q);
    fmt::print("counted {:<16} {:4} kernel names, {:6.0f} launches, {:8.3f} GB moved, {:8.3f} GB shared, peak "
               "{:7.1f} MiB ({:.0f} s on the simulator)\n",
               shape_text(shape), runs.back().counts.size(), total.launches, total.bytes / 1e9,
               total.shared_bytes / 1e9, static_cast<double>(runs.back().peak_bytes) / (1 << 20),
               runs.back().seconds);
    std::fflush(stdout);
  }
  const Model model = fit_model(runs);
  const nn::GPTConfig gpt2 = nn::GPTConfig::preset("gpt2-124m");
  print_check(model, counted(check_shape, fit_shapes.size()), gpt2);

  fmt::print("\n==== PREDICTED (not measured) {}, GPT-2 124M, 12 layers, bf16 params (f32 master weights and "
             "AdamW state), T=1024 ====\n",
             gpu.name);
  fmt::print("per kernel: max(HBM bytes / HBM rate, shared bytes / shared rate, FLOPs / tensor-core or CUDA-core "
             "rate) + launches x overhead (bench/gpu_roofline.h); the figures and where each comes from:\n");
  for (const std::string& line : bench::describe(gpu)) fmt::print("  {}\n", line);
  double tokens_per_second_b64 = 0;
  nlohmann::json prediction{{"source", fmt::format("PREDICTED by bench/gpt2_step_prediction for {}", gpu.name)},
                            {"step_ms", nlohmann::json::object()}};
  for (const int64_t batch : {16, 32, 64}) {
    double step_seconds = 0;
    const double tokens_per_second =
        print_prediction(gpu, model, gpt2, batch, top, measured ? &*measured : nullptr, step_seconds);
    if (batch == 64) tokens_per_second_b64 = tokens_per_second;
    prediction["step_ms"][std::to_string(batch)] = step_seconds * 1e3;
  }
  if (!prediction_path.empty()) std::ofstream(prediction_path) << prediction.dump(1) << '\n';
  fmt::print("\nllm.c, for comparison (PUBLISHED and measured, not predicted): 8 x H100, {:.0f} ms per {:.0f}-token "
             "step = {:.0f} tokens/s per H100, MFU {:.1f} % by the same count; the modded-nanogpt README's llm.c "
             "baseline (10B tokens in 45 min on 8 x H100) gives {:.0f}\n",
             kLlmcStepSeconds * 1e3, kLlmcStepTokens, kLlmcTokensPerSecond,
             100 * llmc_flops_per_token(gpt2, 1024) * kLlmcTokensPerSecond / gpu.tensor_flops_per_second.value,
             10e9 / (45 * 60) / 8);
  fmt::print("PREDICTED B=64 (llm.c's per-GPU batch) against llm.c: {:.2f}x (one GPU here, no gradient all-reduce; "
             "llm.c's 8 pay for theirs)\n",
             tokens_per_second_b64 / kLlmcTokensPerSecond);
  return 0;
}

// Bad input (a malformed --load-counts or --calibration file, clashing paths) is a message, never an abort.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "gpt2_step_prediction: error: {}\n", error.what());
    return 1;
  }
}
