// bench/cuda_kernels: the cuda kernels' memory traffic as the simulator
// counts it, and what that predicts on an H100 SXM. For each op at a GPT-2
// 124M activation size it runs the op on the simulated device and prints the
// launches, the device bytes the kernels read and wrote, the ideal (each
// input read once, each output written once), the FLOPs, and a roofline
// prediction: max(bytes / 3.35 TB/s, FLOPs / 67 TFLOP/s f32). "bound" is the
// same with the ideal bytes, and "of bound" their ratio. A paper estimate
// from counted bytes, not a measurement: caches, clocks and launch latency
// are not in it, and only a GPU can measure them.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <functional>
#include <string>
#include <thread>

#include "bench/machine_context.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

using namespace tessera;
namespace sim = tessera::cuda::sim;

namespace {

constexpr double kHbmBytesPerSecond = 3.35e12;    // H100 SXM, HBM3
constexpr double kF32FlopsPerSecond = 67e12;      // H100 SXM, f32 (no tensor cores)
constexpr double kBf16TensorFlopsPerSecond = 989e12;  // H100 SXM, dense bf16 on tensor cores (GEMMs)
const Device kCuda(DeviceType::cuda);

struct Case {
  std::string name;
  int64_t ideal_bytes;
  int64_t flops;
  std::function<void()> run;
  double peak_flops = kF32FlopsPerSecond;  // the roofline's compute roof for this op
};

void measure(const Case& c) {
  c.run();  // warm-up: allocator blocks, fiber stacks
  current_stream(kCuda)->synchronize();
  sim::reset_kernel_counters();
  c.run();
  current_stream(kCuda)->synchronize();
  int64_t launches = 0, bytes = 0;
  for (const auto& [kernel, counters] : sim::kernel_counters()) {
    launches += counters.launches;
    bytes += counters.device_bytes_read + counters.device_bytes_written;
  }
  const auto roofline = [&](double moved) {
    return std::max(moved / kHbmBytesPerSecond, static_cast<double>(c.flops) / c.peak_flops);
  };
  const double predicted = roofline(static_cast<double>(bytes)), bound = roofline(static_cast<double>(c.ideal_bytes));
  fmt::print("{:<34} {:>8} {:>12} {:>12} {:>6.3f} {:>10} {:>11.2f} {:>9.2f} {:>8.2f}\n", c.name, launches, bytes,
             c.ideal_bytes, static_cast<double>(bytes) / static_cast<double>(c.ideal_bytes), c.flops, predicted * 1e6,
             bound * 1e6, bound / predicted);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera cuda kernels: simulator-counted bytes and an H100 roofline prediction (a paper estimate)"};
  int64_t tokens = 4 * 64;
  int64_t channels = 768;
  app.add_option("--tokens", tokens, "rows (B x T)")->check(CLI::PositiveNumber);
  app.add_option("--channels", channels, "columns (C)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  fmt::print("# cuda kernels on the simulator: cpu={} ({} cores, load {}); shapes [{}, {}] f32 (GPT-2 activations)\n",
             bench::cpu_model(), std::thread::hardware_concurrency(), bench::load_average(), tokens, channels);
  fmt::print("# predicted = max(counted bytes / 3.35 TB/s, FLOPs / 67 TFLOP/s; bf16 GEMMs 989 TFLOP/s) on an H100 SXM: "
             "a paper estimate\n");
  fmt::print("{:<34} {:>8} {:>12} {:>12} {:>6} {:>10} {:>11} {:>9} {:>8}\n", "op", "launches", "bytes", "ideal",
             "ratio", "FLOPs", "predicted us", "bound us", "of bound");

  const int64_t n = tokens * channels;
  const int64_t bytes = n * 4;
  const Tensor x = ops::randn({tokens, channels}, PhiloxKey{1, 1}, {.device = kCuda});
  const Tensor y = ops::randn({tokens, channels}, PhiloxKey{1, 2}, {.device = kCuda});
  const Tensor bias = ops::randn({channels}, PhiloxKey{1, 3}, {.device = kCuda});
  const Tensor mask = ops::gt(x, y);
  const Tensor row_mean = ops::randn({tokens, 1}, PhiloxKey{1, 5}, {.device = kCuda});
  const Tensor zero = ops::zeros({}, {.device = kCuda});
  const Tensor rows = ops::to(ops::arange(0.0, static_cast<double>(tokens), 1.0, {.dtype = DType::i64}), kCuda);
  const Tensor table = ops::randn({tokens * 2, channels}, PhiloxKey{1, 4}, {.device = kCuda});
  std::vector<Case> cases = {
      {"fill", bytes, 0, [&] { ops::full({tokens, channels}, 1.5, {.device = kCuda}); }},
      {"copy (transpose)", 2 * bytes, 0, [&] { ops::contiguous(ops::transpose(x, 0, 1)); }},
      {"cast f32 -> bf16", bytes + n * 2, 0, [&] { ops::to(x, DType::bf16); }},
      {"exp", 2 * bytes, 20 * n, [&] { ops::exp(x); }},
      {"gelu (tanh)", 2 * bytes, 30 * n, [&] { ops::gelu(x); }},
      {"add", 3 * bytes, n, [&] { ops::add(x, y); }},
      {"add bias (broadcast row)", 2 * bytes + channels * 4, n, [&] { ops::add(x, bias); }},
      {"sub row mean (broadcast column)", 2 * bytes + tokens * 4, n, [&] { ops::sub(x, row_mean); }},
      {"mul scalar", 2 * bytes + 4, n, [&] { ops::mul(x, 0.5); }},
      {"masked fill (where, scalar)", 2 * bytes + n + 4, 0, [&] { ops::where(mask, x, zero); }},
      {"where (reads the chosen side)", 2 * bytes + n, 0, [&] { ops::where(mask, x, y); }},
      {"randn", bytes, 60 * n, [&] { ops::randn({tokens, channels}, PhiloxKey{2, 1}, {.device = kCuda}); }},
      {"sum over rows", bytes + tokens * 4, n, [&] { ops::sum(x, {1}); }},
      {"sum over columns", bytes + channels * 4, n, [&] { ops::sum(x, {0}); }},
      {"amax over rows", bytes + tokens * 4, n, [&] { ops::amax(x, {1}); }},
      {"index_select rows (embedding)", 2 * bytes + tokens * 8, 0, [&] { ops::index_select(table, 0, rows); }},
  };
  // Causal attention at GPT-2's head dim: [B, H, T, 64] with B * T = tokens
  // (T = 64) and H = channels / 64. The ideal reads q, k, v once and writes out
  // and logsumexp once (backward: reads q, k, v, out, grad_out, logsumexp,
  // writes the three grads); the tiles re-read k and v (q and grad_out in the
  // backward) once per tile that sees them. FLOPs as the kernels do them on
  // CUDA cores, per visible (query, key) pair: 4D forward (q.k, p v), 14D
  // backward (s and dp in both gradient kernels, dv, dk, dq).
  const int64_t seq = std::min<int64_t>(tokens, 64), heads = std::max<int64_t>(1, channels / 64);
  const Shape attention_shape{tokens / seq, heads, seq, 64};
  const int64_t attention_elements = (tokens / seq) * heads * seq * 64, attention_rows = attention_elements / 64;
  const int64_t visible_pairs = (tokens / seq) * heads * seq * (seq + 1) / 2;
  const auto attention_input = [&](uint64_t stream) {
    return ops::randn(attention_shape, PhiloxKey{3, stream}, {.device = kCuda});
  };
  const Tensor attn_q = attention_input(1), attn_k = attention_input(2), attn_v = attention_input(3),
               attn_grad = attention_input(4);
  const ops::AttentionOutput attention = ops::causal_attention(attn_q, attn_k, attn_v);
  cases.push_back({"causal attention (T 64, D 64)", 4 * (4 * attention_elements + attention_rows),
                   4 * 64 * visible_pairs, [&] { ops::causal_attention(attn_q, attn_k, attn_v); }});
  cases.push_back({"causal attention backward", 4 * (8 * attention_elements + attention_rows),
                   14 * 64 * visible_pairs, [&] {
                     ops::causal_attention_backward(attn_grad, attn_q, attn_k, attn_v, attention.out,
                                                    attention.logsumexp);
                   }});
  // GEMMs (cublasLtMatmul on the simulator, which counts each operand once
  // and 2 FLOPs per multiply-add): GPT-2 124M's linears over `tokens` rows,
  // bias in the epilogue, so the ideal is x, W, bias read and out written
  // once. bf16 is predicted at the tensor cores' dense rate, f32 at the
  // CUDA cores' (TF32 off, the default).
  const auto gemm_case = [&](const char* name, int64_t in, int64_t out, DType dtype) {
    const Tensor gemm_x = ops::randn({tokens, in}, PhiloxKey{4, 1}, {.dtype = dtype, .device = kCuda});
    const Tensor gemm_w = ops::randn({out, in}, PhiloxKey{4, 2}, {.dtype = dtype, .device = kCuda});
    const Tensor gemm_b = ops::randn({out}, PhiloxKey{4, 3}, {.dtype = dtype, .device = kCuda});
    const int64_t element = static_cast<int64_t>(element_size(dtype));
    cases.push_back({name, element * (tokens * in + out * in + out + tokens * out), 2 * tokens * in * out,
                     [=] { ops::linear(gemm_x, gemm_w, gemm_b); },
                     dtype == DType::bf16 ? kBf16TensorFlopsPerSecond : kF32FlopsPerSecond});
  };
  gemm_case("gemm qkv 768->2304 bf16 (+bias)", channels, 3 * channels, DType::bf16);
  gemm_case("gemm fc 768->3072 bf16 (+bias)", channels, 4 * channels, DType::bf16);
  gemm_case("gemm proj 3072->768 bf16 (+bias)", 4 * channels, channels, DType::bf16);
  gemm_case("gemm attn proj 768->768 f32 (+bias)", channels, channels, DType::f32);
  // Training kernels: dropout (the cpu's Philox bits), the fused AdamW step
  // over [tokens, channels] of parameters (reads p, g, m, v, writes p, m, v
  // and the bf16 working copy), clip_grad_norm_'s f64 sum of squares, and
  // the embedding backward (index_add along dim 0 of `tokens` gradient rows
  // into tokens / 4 distinct rows: a device sort of the keys, then each row's
  // run summed in order; ideal: the source and keys read once, each touched
  // row read and written once).
  const KernelTable& device_kernels = kernels(kCuda);
  const Tensor dropout_y = ops::empty({tokens, channels}, {.device = kCuda});
  const Tensor dropout_mask = ops::empty({tokens, channels}, {.device = kCuda});
  cases.push_back({"dropout p=0.1", 3 * bytes, 60 * n,
                   [&] { device_kernels.dropout(dropout_y, dropout_mask, x, 0.1, {5, 1}, {}); }});
  const AdamWTensor adamw{.param = ops::clone(x),
                          .grad = y,
                          .exp_avg = ops::zeros({tokens, channels}, {.device = kCuda}),
                          .exp_avg_sq = ops::zeros({tokens, channels}, {.device = kCuda}),
                          .working_copy = ops::empty({tokens, channels}, {.dtype = DType::bf16, .device = kCuda}),
                          .decay = 1.0 - 6e-4 * 0.1,
                          .step_size = 6e-4,
                          .inv_sqrt_bias2 = 1.0};
  cases.push_back({"adamw step (+bf16 copy)", 7 * bytes + 2 * n, 12 * n, [&] { device_kernels.adamw_step({adamw}, {}); }});
  const Tensor squares_total = ops::empty({}, {.dtype = DType::f64, .device = kCuda});
  cases.push_back({"sum of squares (f64)", bytes + 8, 2 * n, [&] { device_kernels.sum_of_squares(squares_total, {x}); }});
  const int64_t distinct_rows = std::max<int64_t>(1, tokens / 4);
  Tensor host_rows = ops::empty({tokens}, {.dtype = DType::i64});
  for (int64_t i = 0; i < tokens; ++i) host_rows.data_ptr<int64_t>()[i] = (i * 7) % distinct_rows;
  const Tensor embedding_rows = ops::to(host_rows, kCuda);
  Tensor embedding_grad = ops::zeros({tokens * 2, channels}, {.device = kCuda});
  cases.push_back({"embedding backward (index_add)", bytes + 2 * distinct_rows * channels * 4 + tokens * 8, n,
                   [&] { ops::index_add_(embedding_grad, 0, embedding_rows, x); }});
  // The row kernels at [tokens, channels] (softmax, norms: the ideal reads
  // each input once and writes each output once; the norms' statistics are
  // [tokens], weight and bias [channels]) and the fused cross-entropy over
  // GPT-2's vocabulary of 50257 for 8 rows (the forward reads the logits
  // once, the backward reads them once and writes the gradient once).
  // FLOPs are rough counts per element (an exp as one).
  const KernelTable& cuda = kernels(kCuda);
  const auto device_empty = [](const Shape& shape) { return ops::empty(shape, {.device = kCuda}); };
  const Tensor row_out = device_empty({tokens, channels}), row_grad = device_empty({tokens, channels});
  const Tensor norm_mean = device_empty({tokens}), norm_rstd = device_empty({tokens});
  const Tensor grad_weight = device_empty({channels}), grad_bias = device_empty({channels});
  const Tensor norm_bias = ops::randn({channels}, PhiloxKey{1, 6}, {.device = kCuda});
  cases.push_back({"softmax", 2 * bytes, 5 * n, [&] { cuda.softmax(row_out, x, false); }});
  cases.push_back({"softmax backward", 3 * bytes, 4 * n, [&] { cuda.softmax_backward(row_grad, y, row_out, false); }});
  cases.push_back({"layer_norm", 2 * bytes + 4 * (2 * channels + 2 * tokens), 8 * n,
                   [&] { cuda.norm(row_out, norm_mean, norm_rstd, x, bias, norm_bias, 1e-5); }});
  cases.push_back({"layer_norm backward", 3 * bytes + 4 * (3 * channels + 2 * tokens), 12 * n, [&] {
                     cuda.norm_backward(row_grad, grad_weight, grad_bias, y, x, bias, norm_mean, norm_rstd);
                   }});
  cases.push_back({"rms_norm", 2 * bytes + 4 * (channels + tokens), 6 * n,
                   [&] { cuda.norm(row_out, Tensor(), norm_rstd, x, bias, Tensor(), 1e-5); }});
  cases.push_back({"rms_norm backward", 3 * bytes + 4 * (2 * channels + tokens), 9 * n, [&] {
                     cuda.norm_backward(row_grad, grad_weight, Tensor(), y, x, bias, Tensor(), norm_rstd);
                   }});
  const int64_t vocab_rows = 8, vocab = 50257;
  const Tensor logits = ops::randn({vocab_rows, vocab}, PhiloxKey{1, 7}, {.device = kCuda});
  const Tensor vocab_targets = ops::to(ops::arange(0.0, static_cast<double>(vocab_rows), 1.0, {.dtype = DType::i64}), kCuda);
  const Tensor ce_loss = device_empty({}), ce_logsumexp = device_empty({vocab_rows});
  const Tensor ce_grad = device_empty({vocab_rows, vocab}), ce_grad_loss = ops::ones({}, {.device = kCuda});
  cases.push_back({"cross_entropy [8, 50257]", 4 * vocab_rows * vocab + 12 * vocab_rows + 4, 4 * vocab_rows * vocab,
                   [&] { cuda.cross_entropy(ce_loss, ce_logsumexp, logits, vocab_targets, -100, vocab); }});
  cases.push_back({"cross_entropy backward [8, 50257]", 8 * vocab_rows * vocab + 12 * vocab_rows + 4,
                   3 * vocab_rows * vocab, [&] {
                     cuda.cross_entropy_backward(ce_grad, ce_grad_loss, logits, ce_logsumexp, vocab_targets, -100, vocab);
                   }});
  for (const Case& c : cases) measure(c);
  return 0;
}
