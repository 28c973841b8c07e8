// The row-wise cuda kernels (softmax/log_softmax, layer/RMS norm, the fused
// cross-entropy, forward and backward) against the cpu kernels on the same
// inputs, bf16 against an f32 reference of the rounded inputs, the weight and
// bias gradients bit for bit from run to run, ignore_index, the errors, the
// bytes the simulator counts against the ideal, and gradchecks in f64 on cuda.
// add_layer_norm (the residual add fused into the norm kernels): bit for bit
// add then layer_norm on the device, alone and in a TransformerBlock. The
// norm kernels' 16-byte path against their one-value-at-a-time path (bit for
// bit), and their per-block partials against the workspace sized for them.
//
// Tolerances. The cpu sums every row in f64 (lane_sum.h) and rounds once; the
// device sums in the arithmetic type (f32 for f32 and bf16, f64 for f64): a
// thread adds its ceil(cols / G) columns in order, then a butterfly over the
// G threads of the row's group adds log2(G) levels (G = 32, 128 or 512
// by row length, row_group.h). A sum of n terms so added is within
// depth u sum|terms| of the exact one, depth = ceil(cols / G) + log2(G) and u
// the unit roundoff; every output is that sum used in a few more roundings
// (exp within 2 ulp on both sides, a division, a product). So each element is
// checked within (depth + 16) u (|cpu value| + the row's scale), where the
// scale is the magnitude the sums carry (stated per kernel below). The norm
// kernels add a thread's chunks of 8 columns, so their depth is
// norm_sum_depth's.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "nn/transformer_block.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/cuda/normalization.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

#include "tests/cuda/counted_bytes.h"

using namespace tessera;
using tessera::testing::counted_bytes;
using tessera::testing::CountedBytes;

namespace {

const Device kCuda(DeviceType::cuda);


// Normal values on the cpu, in f64 (rounded to `dtype` by the caller).
Tensor normal(const Shape& shape, uint64_t stream, double scale = 1.0) {
  return ops::mul(ops::randn(shape, PhiloxKey{2024, stream}, {.dtype = DType::f64}),
                  ops::full({}, scale, {.dtype = DType::f64}));
}

std::vector<double> values_of(const Tensor& t) { return ops::to(ops::contiguous(t), kCPU).to_vector<double>(); }

double unit_roundoff(DType dtype) { return std::ldexp(1.0, dtype == DType::f64 ? -53 : -24); }

// The group of threads that takes a row of `cols` (row_group.h's shapes) and
// the rounding depth of a sum over it.
int group_threads(int64_t cols) {
  if (cols <= 256) return 32;
  if (cols <= 1024) return 128;
  return 512;
}
double sum_depth(int64_t cols) {
  const int g = group_threads(cols);
  return std::ceil(static_cast<double>(cols) / g) + std::log2(static_cast<double>(g));
}
// The norm kernels' (normalization.cu): a thread adds its chunks of 8
// columns in order (chunks lane, lane + G, ...), a warp's butterfly adds 5
// levels, and a block of G threads a row (past 1024 columns, or 256 for f64)
// then adds its G / 32 warps in order.
double norm_sum_depth(int64_t cols, DType dtype) {
  const int64_t chunks = (cols + 7) / 8;
  if (cols <= (dtype == DType::f64 ? 256 : 1024)) return 8.0 * static_cast<double>((chunks + 31) / 32) + 5.0;
  const int64_t g = dtype == DType::f64 && cols <= 1024 ? 128 : 512;
  return 8.0 * static_cast<double>((chunks + g - 1) / g) + 5.0 + static_cast<double>(g / 32 - 1);
}

// Every |device - cpu| <= (depth + 16) u (|cpu| + scale[i]), u of the
// arithmetic (`dtype`: f32 for bf16 rows), plus 2^-8 |cpu| for a bf16 output
// (the one rounding of the f32 result); reports the worst ratio to that bound.
void check_within(const char* what, const Tensor& device, const Tensor& cpu, double depth, DType dtype,
                  const std::vector<double>& scale) {
  const double output_rounding = device.dtype() == DType::bf16 ? std::ldexp(1.0, -8) : 0.0;
  const std::vector<double> got = values_of(device), want = values_of(cpu);
  REQUIRE(got.size() == want.size());
  const double u = unit_roundoff(dtype);
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound =
        output_rounding * std::abs(want[i]) + (depth + 16.0) * u * (std::abs(want[i]) + scale[i % scale.size()]);
    const double error = std::abs(got[i] - want[i]);
    if (!(error <= bound)) {
      FAIL_CHECK(std::string(what) << ": element " << i << " is " << got[i] << " on cuda, " << want[i] << " on cpu (bound " << bound
                      << ")");
      return;
    }
    if (bound > 0) worst = std::max(worst, error / bound);
  }
  MESSAGE(std::string(what) << ": worst error " << worst << " of the bound");
}

// Per element: the row's largest |value| (the scale of a row's sums).
std::vector<double> row_max_abs(const Tensor& t, int64_t cols) {
  const std::vector<double> v = values_of(t);
  std::vector<double> scale(v.size(), 0.0);
  for (size_t row = 0; row * cols < v.size(); ++row) {
    double largest = 0.0;
    for (int64_t c = 0; c < cols; ++c) largest = std::max(largest, std::abs(v[row * cols + c]));
    for (int64_t c = 0; c < cols; ++c) scale[row * cols + c] = largest;
  }
  return scale;
}

// The scale of a softmax backward's sums: the row's largest |g|, times
// 1 + p cols for log_softmax (exp(y) sum(g), sum(g) within depth u cols max|g|).
std::vector<double> softmax_backward_scale(const Tensor& g, const Tensor& y, int64_t cols, bool log) {
  std::vector<double> scale = row_max_abs(g, cols);
  if (!log) return scale;
  const std::vector<double> p = values_of(ops::exp(ops::to(y, DType::f64)));
  for (size_t i = 0; i < scale.size(); ++i) scale[i] *= 1.0 + p[i] * static_cast<double>(cols);
  return scale;
}

const std::vector<int64_t> kColumns = {1, 7, 31, 32, 33, 768, 1000, 50257};

// Rows to test at a row length: one, and many (fewer for the long rows, to
// keep the simulator's run short).
std::vector<int64_t> row_counts(int64_t cols) { return cols >= 10000 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 37}; }

}  // namespace

TEST_CASE("softmax and log_softmax, forward and backward, match the cpu in f32 and f64") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const int64_t cols : kColumns) {
      for (const int64_t rows : row_counts(cols)) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(cols);
        CAPTURE(rows);
        const Tensor x = ops::to(normal({rows, cols}, 1, 3.0), dtype);
        const Tensor g = ops::to(normal({rows, cols}, 2), dtype);
        const Tensor x_dev = ops::to(x, kCuda), g_dev = ops::to(g, kCuda);
        const double depth = sum_depth(cols);
        for (const bool log : {false, true}) {
          CAPTURE(log);
          const Tensor y = log ? ops::log_softmax(x, -1) : ops::softmax(x, -1);
          const Tensor y_dev = log ? ops::log_softmax(x_dev, -1) : ops::softmax(x_dev, -1);
          // softmax: y = e / sum, each e within a relative (depth + few) u; log_softmax:
          // (x - max) - log(sum), an absolute error of the sum's relative one.
          check_within("forward", y_dev, y, depth, dtype, {log ? 1.0 : 0.0});
          // The backward from the same y on both devices: dx = y (g - <g, y>)
          // or g - exp(y) sum(g); the sums carry the row's largest |g|
          // (times a probability of at most 1, or times the row length for log_softmax).
          const Tensor dx = log ? ops::log_softmax_backward(g, y, -1) : ops::softmax_backward(g, y, -1);
          const Tensor dx_dev = log ? ops::log_softmax_backward(g_dev, ops::to(y, kCuda), -1)
                                    : ops::softmax_backward(g_dev, ops::to(y, kCuda), -1);
          check_within("backward", dx_dev, dx, depth, dtype, softmax_backward_scale(g, y, cols, log));
        }
      }
    }
  }
}

TEST_CASE("softmax, log_softmax and cross-entropy keep -inf entries (masked positions) exact on cuda") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const int64_t cols : {int64_t{4}, int64_t{300}, int64_t{9000}}) {  // a warp, a block, the re-reading path
    CAPTURE(cols);
    std::vector<float> values(static_cast<size_t>(cols), -kInf);
    values[0] = values[2] = 0.0f;
    const Tensor row = ops::to(ops::from_vector(values, {1, cols}), kCuda);
    std::vector<float> expected(static_cast<size_t>(cols), 0.0f);
    expected[0] = expected[2] = 0.5f;
    CHECK(ops::to(ops::softmax(row, -1), kCPU).to_vector<float>() == expected);
    const std::vector<float> log_probs = ops::to(ops::log_softmax(row, -1), kCPU).to_vector<float>();
    CHECK(log_probs[0] == doctest::Approx(-std::log(2.0)).epsilon(1e-7));
    CHECK(log_probs[1] == -kInf);
    CHECK(ops::cross_entropy(row, ops::to(ops::from_vector(std::vector<int64_t>{2}, {1}), kCuda)).item() ==
          doctest::Approx(std::log(2.0)).epsilon(1e-7));
  }
}

TEST_CASE("layer_norm and rms_norm, forward and backward, match the cpu in f32 and f64") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    // Each shape (normalization.cu): a warp and 1 to 4 chunks a thread, a
    // block of 128 (f64) or 512; column counts off a multiple of 8 move one
    // value at a time.
    for (const int64_t cols : {1, 7, 31, 32, 33, 300, 768, 1000, 1001, 4096}) {
      for (const int64_t rows : {int64_t{1}, int64_t{37}}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(cols);
        CAPTURE(rows);
        const Tensor x = ops::to(ops::add(normal({rows, cols}, 3, 2.0), ops::full({}, 0.5, {.dtype = DType::f64})), dtype);
        const Tensor w = ops::to(normal({cols}, 4), dtype), b = ops::to(normal({cols}, 5), dtype);
        const Tensor gy = ops::to(normal({rows, cols}, 6), dtype);
        const Tensor x_dev = ops::to(x, kCuda), w_dev = ops::to(w, kCuda), b_dev = ops::to(b, kCuda),
                     gy_dev = ops::to(gy, kCuda);
        const double depth = norm_sum_depth(cols, dtype);
        for (const bool layer : {true, false}) {
          CAPTURE(layer);
          const ops::NormOutput cpu = layer ? ops::layer_norm(x, w, b, 1e-5) : ops::rms_norm(x, w, 1e-5);
          const ops::NormOutput dev = layer ? ops::layer_norm(x_dev, w_dev, b_dev, 1e-5) : ops::rms_norm(x_dev, w_dev, 1e-5);
          // y = xhat w + b with xhat of order 1: the statistics' errors (relative
          // depth u of a row of order-1 values) scale |w|, plus |b|'s rounding.
          std::vector<double> scale = values_of(ops::add(ops::abs(w), ops::abs(b)));
          for (double& s : scale) s += 1.0;
          check_within("y", dev.y, cpu.y, depth, dtype, scale);
          check_within("rstd", dev.rstd, cpu.rstd, depth, dtype, {0.0});
          if (layer) check_within("mean", dev.mean, cpu.mean, depth, dtype, {2.0});

          const ops::NormGrads grads = layer ? ops::layer_norm_backward(gy, x, w, cpu.mean, cpu.rstd, true)
                                             : ops::rms_norm_backward(gy, x, w, cpu.rstd);
          const ops::NormGrads grads_dev =
              layer ? ops::layer_norm_backward(gy_dev, x_dev, w_dev, ops::to(cpu.mean, kCuda), ops::to(cpu.rstd, kCuda), true)
                    : ops::rms_norm_backward(gy_dev, x_dev, w_dev, ops::to(cpu.rstd, kCuda));
          // dx = rstd (gw - mean(gw) - xhat mean(gw xhat)): sums over the row of
          // |gw| (|xhat| + 1), times xhat: the row's largest |gy w| times
          // 16 (normal rows: |xhat| < 5), times rstd.
          std::vector<double> gx_scale = row_max_abs(ops::mul(gy, w), cols);
          const std::vector<double> rstd = values_of(cpu.rstd);
          for (size_t i = 0; i < gx_scale.size(); ++i) gx_scale[i] *= 16.0 * rstd[i / cols];
          check_within("grad_x", grads_dev.x, grads.x, depth, dtype, gx_scale);
          // dweight, dbias: sums over the rows of gy xhat and gy, in a different
          // order on each device: depth up to the row count, scale sum|gy| (|xhat| + 1).
          std::vector<double> column_scale(static_cast<size_t>(cols), 0.0);
          const std::vector<double> gyv = values_of(gy);
          for (size_t i = 0; i < gyv.size(); ++i) column_scale[i % cols] += 5.0 * std::abs(gyv[i]);
          check_within("grad_weight", grads_dev.weight, grads.weight, static_cast<double>(rows), dtype, column_scale);
          if (layer) check_within("grad_bias", grads_dev.bias, grads.bias, static_cast<double>(rows), dtype, column_scale);
        }
      }
    }
  }
}

TEST_CASE("cross_entropy, forward and backward, matches the cpu with ignored rows, in f32 and f64") {
  constexpr int64_t kIgnore = -100;
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const int64_t cols : kColumns) {
      for (const int64_t rows : row_counts(cols)) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(cols);
        CAPTURE(rows);
        const Tensor logits = ops::to(normal({rows, cols}, 7, 4.0), dtype);
        std::vector<int64_t> target_values;
        for (int64_t r = 0; r < rows; ++r) target_values.push_back(r % 5 == 3 ? kIgnore : (r * 7919 + cols - 1) % cols);
        const Tensor targets = ops::from_vector(target_values, {rows});
        const Tensor logits_dev = ops::to(logits, kCuda), targets_dev = ops::to(targets, kCuda);
        const ops::CrossEntropyOutput cpu = ops::cross_entropy_with_logsumexp(logits, targets, kIgnore);
        const ops::CrossEntropyOutput dev = ops::cross_entropy_with_logsumexp(logits_dev, targets_dev, kIgnore);
        CHECK(dev.loss.device() == kCuda);
        // logsumexp = max + log(sum exp(x - max)): the sum's relative error
        // (online rescaling adds a rounding per new maximum: depth + 2 log2(cols)) as an absolute one.
        const double depth = sum_depth(cols) + 2.0 * std::log2(static_cast<double>(cols));
        check_within("logsumexp", dev.logsumexp, cpu.logsumexp, depth, dtype, {1.0});
        // The loss, a mean of lse - x[t], is within the same absolute bound.
        check_within("loss", dev.loss, cpu.loss, depth, dtype, {1.0});
        const Tensor grad_loss = ops::full({}, 1.5, {.dtype = dtype});
        const Tensor grad = ops::cross_entropy_backward(grad_loss, logits, targets, kIgnore, cpu.logsumexp);
        const Tensor grad_dev =
            ops::cross_entropy_backward(ops::to(grad_loss, kCuda), logits_dev, targets_dev, kIgnore, ops::to(cpu.logsumexp, kCuda));
        // From the same logsumexp the arithmetic is the cpu's (exp, a product,
        // one subtraction at the target): a few roundings of the scale 1.5 / kept.
        check_within("grad", grad_dev, grad, 0.0, dtype, {1.5});
        const std::vector<double> gv = values_of(grad_dev);
        for (int64_t r = 0; r < rows; ++r) {
          if (target_values[r] != kIgnore) continue;
          for (int64_t c = 0; c < cols; ++c) CHECK(gv[r * cols + c] == 0.0);
        }
      }
    }
  }
  // Every row ignored: the loss is NaN (0/0) like the cpu's, the gradient zero.
  const Tensor none = ops::to(ops::from_vector(std::vector<int64_t>{kIgnore, kIgnore}, {2}), kCuda);
  const Tensor zeros = ops::zeros({2, 3}, {.device = kCuda});
  CHECK(std::isnan(ops::cross_entropy(zeros, none, kIgnore).item()));
  for (double value : values_of(ops::cross_entropy_backward(ops::ones({}, {.device = kCuda}), zeros, none, kIgnore))) {
    CHECK(value == 0.0);
  }
}

// A padded vocabulary: the kernels read only the first `classes` columns of
// each [columns] row and write the padding's gradient as zero. Pitches of a
// multiple of 16 bytes take the packed loads, others single values: either
// way the classes' figures are the unpadded rows' up to the order of the
// sums (the same bits where both read single values, [5, 7]).
TEST_CASE("cross_entropy's chunked pass: the logsumexp of rows whose maximum moves in every chunk, against f64") {
  // Rising rows rescale the running sum once a chunk of 8 (MaxSum::add_chunk),
  // falling ones never after the first; both against the f64 logsumexp of
  // the same (rounded) logits.
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const int64_t cols : {int64_t{256}, int64_t{8192}, int64_t{50304}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(cols);
      std::vector<double> values;
      for (int64_t c = 0; c < cols; ++c) values.push_back(20.0 * static_cast<double>(c) / static_cast<double>(cols));
      for (int64_t c = 0; c < cols; ++c) values.push_back(-20.0 * static_cast<double>(c) / static_cast<double>(cols));
      const Tensor logits = ops::to(ops::from_vector(values, {2, cols}, {.dtype = DType::f64}), dtype);
      const Tensor targets = ops::to(ops::from_vector(std::vector<int64_t>{3, cols - 1}, {2}), kCuda);
      const ops::CrossEntropyOutput out = ops::cross_entropy_with_logsumexp(ops::to(logits, kCuda), targets);
      const ops::CrossEntropyOutput reference =
          ops::cross_entropy_with_logsumexp(ops::to(logits, DType::f64), ops::to(targets, kCPU));
      const double depth = sum_depth(cols) + 2.0 * std::log2(static_cast<double>(cols));
      check_within("logsumexp", out.logsumexp, reference.logsumexp, depth, DType::f32, {0.0});
    }
  }
}

TEST_CASE("cross_entropy with padding columns: the unpadded rows' loss and gradient, the padding's gradient zero") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [classes, columns] :
         {std::pair<int64_t, int64_t>{5, 7}, {5, 8}, {250, 256}, {2000, 2048}, {50257, 50304}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(classes);
      CAPTURE(columns);
      const int64_t rows = 6;
      Tensor logits = ops::to(normal({rows, columns}, 11, 4.0), dtype);
      Tensor padding = ops::narrow(logits, 1, classes, columns - classes);
      ops::fill_(padding, 40.0);  // would dominate any softmax it entered
      const Tensor logits_dev = ops::to(logits, kCuda);
      const Tensor unpadded_dev = ops::to(ops::contiguous(ops::narrow(logits, 1, 0, classes)), kCuda);
      const Tensor targets = ops::to(ops::from_vector(std::vector<int64_t>{0, classes - 1, -100, 3, 1, 2}, {rows}), kCuda);
      const ops::CrossEntropyOutput padded = ops::cross_entropy_with_logsumexp(logits_dev, targets, -100, classes);
      const ops::CrossEntropyOutput plain = ops::cross_entropy_with_logsumexp(unpadded_dev, targets);
      const Tensor grad_loss = ops::full({}, 0.5, {.dtype = dtype, .device = kCuda});
      const Tensor grad = ops::to(
          ops::cross_entropy_backward(grad_loss, logits_dev, targets, -100, padded.logsumexp, classes), kCPU);
      const std::vector<double> grad_classes = values_of(ops::narrow(grad, 1, 0, classes));
      const std::vector<double> grad_plain =
          values_of(ops::cross_entropy_backward(grad_loss, unpadded_dev, targets, -100, plain.logsumexp));
      if (columns == 7) {
        CHECK(values_of(padded.loss) == values_of(plain.loss));
        CHECK(values_of(padded.logsumexp) == values_of(plain.logsumexp));
        CHECK(grad_classes == grad_plain);
      } else {
        // Each row's sum of |x| <= 16 exponentials in f32, in another order:
        // the log-sum-exp within a few f32 roundings of its magnitude (< 30).
        check_within("padded logsumexp", padded.logsumexp, plain.logsumexp, 2.0 * std::log2(double(classes)), DType::f32, {30.0});
        check_within("padded loss", padded.loss, plain.loss, 2.0 * std::log2(double(classes)), DType::f32, {30.0});
        // exp(x - lse) moves by the log-sum-exp's difference, up to about 2e-6
        // for 50257 classes on an H100 (4 x 2^-20), then rounds once to the
        // dtype (bf16: up to one unit, 2^-8 relative, either way).
        const double unit = dtype == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -18);
        double worst = 0;
        for (size_t i = 0; i < grad_plain.size(); ++i) {
          const double bound = unit * std::abs(grad_plain[i]) + 1e-12;
          worst = std::max(worst, std::abs(grad_classes[i] - grad_plain[i]) / bound);
        }
        CHECK(worst <= 1.0);
      }
      CHECK(values_of(ops::narrow(grad, 1, classes, columns - classes)) ==
            std::vector<double>(static_cast<size_t>(rows * (columns - classes)), 0.0));
    }
  }
}

TEST_CASE("bf16 rows compute in f32: each kernel against an f32 reference of the rounded inputs") {
  const KernelTable& cuda = kernels(kCuda);
  const auto bf16 = [](const Tensor& t) { return ops::to(t, DType::bf16); };
  const auto f32 = [](const Tensor& t) { return ops::to(t, DType::f32); };
  const auto dev = [](const Tensor& t) { return ops::to(t, kCuda); };
  const auto empty = [](const Shape& shape, DType dtype) { return ops::empty(shape, {.dtype = dtype, .device = kCuda}); };
  // The device result is the f32 computation (within the f32 bound above)
  // rounded once to bf16: within 2^-8 relative of the reference, plus the f32 bound.
  for (const int64_t cols : {int64_t{33}, int64_t{768}, int64_t{50257}}) {
    const int64_t rows = cols > 10000 ? 2 : 9;
    CAPTURE(cols);
    const double depth = sum_depth(cols) + 2.0 * std::log2(static_cast<double>(cols));
    const Tensor x = bf16(normal({rows, cols}, 11, 3.0)), g = bf16(normal({rows, cols}, 12));
    // softmax and its backward
    for (const bool log : {false, true}) {
      const Tensor y = empty({rows, cols}, DType::bf16);
      cuda.softmax(y, dev(x), log);
      const Tensor reference = log ? ops::log_softmax(f32(x), -1) : ops::softmax(f32(x), -1);
      check_within("softmax bf16", y, reference, depth, DType::f32, {log ? 1.0 : 0.0});
      const Tensor dx = empty({rows, cols}, DType::bf16);
      cuda.softmax_backward(dx, dev(g), y, log);
      const Tensor y_rounded = f32(ops::to(y, kCPU));
      const Tensor dx_reference = log ? ops::log_softmax_backward(f32(g), y_rounded, -1) : ops::softmax_backward(f32(g), y_rounded, -1);
      check_within("softmax_backward bf16", dx, dx_reference, depth, DType::f32,
                   softmax_backward_scale(f32(g), y_rounded, cols, log));
    }
    // cross-entropy: loss and logsumexp in f32, the gradient in bf16
    const Tensor targets = ops::from_vector(std::vector<int64_t>(static_cast<size_t>(rows), cols - 1), {rows});
    const Tensor loss = empty({}, DType::f32), lse = empty({rows}, DType::f32);
    cuda.cross_entropy(loss, lse, dev(x), dev(targets), -100, cols);
    const ops::CrossEntropyOutput reference = ops::cross_entropy_with_logsumexp(f32(x), targets);
    check_within("cross_entropy loss bf16", loss, reference.loss, depth, DType::f32, {1.0});
    check_within("cross_entropy logsumexp bf16", lse, reference.logsumexp, depth, DType::f32, {1.0});
    const Tensor grad = empty({rows, cols}, DType::bf16);
    cuda.cross_entropy_backward(grad, ops::ones({}, {.device = kCuda}), dev(x), lse, dev(targets), -100, cols);
    const Tensor grad_reference = ops::cross_entropy_backward(ops::ones({}), f32(x), targets, -100, reference.logsumexp);
    check_within("cross_entropy grad bf16", grad, grad_reference, depth, DType::f32, {1.0 / static_cast<double>(rows)});
  }
  for (const int64_t cols : {int64_t{33}, int64_t{768}}) {
    CAPTURE(cols);
    const int64_t rows = 40;
    const Tensor x = bf16(normal({rows, cols}, 13, 2.0)), w = bf16(normal({cols}, 14)), b = bf16(normal({cols}, 15));
    const Tensor gy = bf16(normal({rows, cols}, 16));
    const Tensor y = empty({rows, cols}, DType::bf16), mean = empty({rows}, DType::f32), rstd = empty({rows}, DType::f32);
    cuda.norm(y, mean, rstd, dev(x), dev(w), dev(b), 1e-5);
    const ops::NormOutput reference = ops::layer_norm(f32(x), f32(w), f32(b), 1e-5);
    std::vector<double> scale = values_of(ops::add(ops::abs(f32(w)), ops::abs(f32(b))));
    for (double& s : scale) s += 1.0;
    const double depth = norm_sum_depth(cols, DType::bf16);
    check_within("layer_norm y bf16", y, reference.y, depth, DType::f32, scale);
    check_within("layer_norm rstd bf16 (f32)", rstd, reference.rstd, depth, DType::f32, {0.0});
    const Tensor gx = empty({rows, cols}, DType::bf16), gw = empty({cols}, DType::bf16), gb = empty({cols}, DType::bf16);
    cuda.norm_backward(gx, gw, gb, dev(gy), dev(x), dev(w), dev(reference.mean), dev(reference.rstd));
    const ops::NormGrads grads = ops::layer_norm_backward(f32(gy), f32(x), f32(w), reference.mean, reference.rstd, true);
    std::vector<double> gx_scale = row_max_abs(ops::mul(f32(gy), f32(w)), cols);
    const std::vector<double> rstd_values = values_of(reference.rstd);
    for (size_t i = 0; i < gx_scale.size(); ++i) gx_scale[i] *= 16.0 * rstd_values[i / cols];
    check_within("layer_norm grad_x bf16", gx, grads.x, depth, DType::f32, gx_scale);
    check_within("layer_norm grad_weight bf16", gw, grads.weight, rows, DType::f32, {5.0 * rows});
    check_within("layer_norm grad_bias bf16", gb, grads.bias, rows, DType::f32, {5.0 * rows});
  }
}

TEST_CASE("norm weight and bias gradients and the cross-entropy loss are the same bits on every run") {
  const int64_t rows = 300, cols = 768;
  const Tensor x = ops::to(ops::to(normal({rows, cols}, 21), DType::f32), kCuda);
  const Tensor w = ops::to(ops::to(normal({cols}, 22), DType::f32), kCuda);
  const Tensor b = ops::to(ops::to(normal({cols}, 23), DType::f32), kCuda);
  const Tensor gy = ops::to(ops::to(normal({rows, cols}, 24), DType::f32), kCuda);
  const ops::NormOutput forward = ops::layer_norm(x, w, b, 1e-5);
  const Tensor targets = ops::to(ops::from_vector(std::vector<int64_t>(static_cast<size_t>(rows), 5), {rows}), kCuda);
  std::vector<double> first_weight, first_bias, first_loss;
  for (uint64_t run = 0; run < 3; ++run) {
#if TESSERA_HAVE_CUDA_SIM
    cuda::sim::set_block_order_seed(run * 7919 + 1);  // blocks run in another order each time
#endif
    const ops::NormGrads grads = ops::layer_norm_backward(gy, x, w, forward.mean, forward.rstd, true);
    const std::vector<double> loss = values_of(ops::cross_entropy(x, targets));
    if (run == 0) {
      first_weight = values_of(grads.weight);
      first_bias = values_of(grads.bias);
      first_loss = loss;
      continue;
    }
    CHECK(values_of(grads.weight) == first_weight);  // doubles exactly holding the f32 bits
    CHECK(values_of(grads.bias) == first_bias);
    CHECK(loss == first_loss);
  }
}

// The same values at a base 2 or 4 bytes off 16: contiguous rows the norm
// kernels cannot move in 16-byte packs.
Tensor misaligned(const Tensor& t) {
  const Tensor flat = ops::reshape(ops::contiguous(t), {t.numel()});
  const Tensor padded = ops::cat({ops::zeros({1}, {.dtype = t.dtype(), .device = t.device()}), flat}, 0);
  return ops::view(ops::narrow(padded, 0, 1, t.numel()), t.sizes());
}

TEST_CASE("norm kernels: rows off 16-byte alignment give the packed rows' bits, forward and backward") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (const int64_t cols : {int64_t{64}, int64_t{768}, int64_t{1024}, int64_t{2048}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(cols);
      const int64_t rows = 11;
      const auto dev = [&](const Tensor& t) { return ops::to(ops::to(t, dtype), kCuda); };
      const Tensor x = dev(normal({rows, cols}, 80, 2.0)), delta = dev(normal({rows, cols}, 81));
      const Tensor w = dev(normal({cols}, 82)), b = dev(normal({cols}, 83)), gy = dev(normal({rows, cols}, 84));
      const Tensor x_off = misaligned(x), w_off = misaligned(w), gy_off = misaligned(gy);
      REQUIRE(reinterpret_cast<uintptr_t>(x_off.cuda_data()) % 16 != 0);
      const ops::NormOutput packed = ops::layer_norm(x, w, b, 1e-5);
      const ops::NormOutput single = ops::layer_norm(x_off, w_off, b, 1e-5);
      CHECK(values_of(single.y) == values_of(packed.y));
      CHECK(values_of(single.mean) == values_of(packed.mean));
      CHECK(values_of(single.rstd) == values_of(packed.rstd));
      const ops::NormGrads grads = ops::layer_norm_backward(gy, x, w, packed.mean, packed.rstd, true);
      const ops::NormGrads grads_off = ops::layer_norm_backward(gy_off, x_off, w_off, packed.mean, packed.rstd, true);
      CHECK(values_of(grads_off.x) == values_of(grads.x));
      CHECK(values_of(grads_off.weight) == values_of(grads.weight));
      CHECK(values_of(grads_off.bias) == values_of(grads.bias));
      const ops::AddNormOutput fused = ops::add_layer_norm(x, delta, w, b, 1e-5);
      const ops::AddNormOutput fused_off = ops::add_layer_norm(x, misaligned(delta), w, b, 1e-5);
      CHECK(values_of(fused_off.sum) == values_of(fused.sum));
      CHECK(values_of(fused_off.norm.y) == values_of(fused.norm.y));
    }
  }
}

TEST_CASE("norm kernels on no rows: nothing to normalise, zero weight and bias gradients") {
  const Tensor x = ops::zeros({0, 24}, {.device = kCuda}), w = ops::ones({24}, {.device = kCuda});
  const ops::NormOutput out = ops::layer_norm(x, w, w, 1e-5);
  CHECK(out.y.sizes() == Shape{0, 24});
  const ops::NormGrads grads = ops::layer_norm_backward(x, x, w, out.mean, out.rstd, true);
  CHECK(values_of(grads.weight) == std::vector<double>(24, 0.0));
  CHECK(values_of(grads.bias) == std::vector<double>(24, 0.0));
}

TEST_CASE("norm backward: many blocks' partials, in the workspace the launch sizes") {
  // 2000 rows: a block per 32 rows; 9000: the cap of 264 blocks, 34 or 35 rows each.
  for (const auto& [rows, blocks] : {std::pair<int64_t, int64_t>{2000, 63}, std::pair<int64_t, int64_t>{9000, 264}}) {
    CAPTURE(rows);
    const int64_t cols = 40;
    const Tensor x = ops::to(normal({rows, cols}, 90, 2.0), DType::f32), w = ops::to(normal({cols}, 91), DType::f32);
    const Tensor gy = ops::to(normal({rows, cols}, 92), DType::f32);
    const ops::NormOutput cpu = ops::layer_norm(x, w, Tensor(), 1e-5);
    const ops::NormGrads want = ops::layer_norm_backward(gy, x, w, cpu.mean, cpu.rstd, true);
    CHECK(cuda::norm_backward_workspace_elements(DType::f32, rows, cols) == blocks * 2 * cols);
    ops::NormGrads got;
    const auto run = [&] {
      got = ops::layer_norm_backward(ops::to(gy, kCuda), ops::to(x, kCuda), ops::to(w, kCuda), ops::to(cpu.mean, kCuda),
                                     ops::to(cpu.rstd, kCuda), true);
    };
#if TESSERA_SIM_CHECKS
    current_stream(kCuda)->synchronize();
    cuda::sim::reset_kernel_counters();
    run();
    current_stream(kCuda)->synchronize();
    for (const auto& [name, counter] : cuda::sim::kernel_counters()) {
      if (name.find("norm_backward_kernel") != std::string::npos) CHECK(counter.blocks == blocks);
      if (name.find("norm_parameter_grads_kernel") != std::string::npos) {
        CHECK(counter.device_bytes_read == blocks * 2 * cols * 4);  // each block's partial, once
      }
    }
#else
    run();
#endif
    std::vector<double> column_scale(static_cast<size_t>(cols), 0.0);
    const std::vector<double> gyv = values_of(gy);
    for (size_t i = 0; i < gyv.size(); ++i) column_scale[i % cols] += 5.0 * std::abs(gyv[i]);
    // A column's sum: a block's rows in order, then the blocks' partials (at most that deep).
    const double depth = static_cast<double>(rows / blocks + 1 + blocks);
    check_within("grad_weight", got.weight, want.weight, depth, DType::f32, column_scale);
    check_within("grad_bias", got.bias, want.bias, depth, DType::f32, column_scale);
    std::vector<double> gx_scale = row_max_abs(ops::mul(gy, w), cols);
    const std::vector<double> rstd = values_of(cpu.rstd);
    for (size_t i = 0; i < gx_scale.size(); ++i) gx_scale[i] *= 16.0 * rstd[i / cols];
    check_within("grad_x", got.x, want.x, norm_sum_depth(cols, DType::f32), DType::f32, gx_scale);
  }
}

TEST_CASE("add_layer_norm on cuda: add then layer_norm's bits, forward and backward, and the cpu's within rounding") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const int64_t cols : {7, 33, 768, 4096}) {
      for (const int64_t rows : {int64_t{1}, int64_t{37}}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(cols);
        CAPTURE(rows);
        const auto dev = [](const Tensor& t) { return ops::to(t, kCuda); };
        const Tensor x = ops::to(normal({rows, cols}, 50, 2.0), dtype), delta = ops::to(normal({rows, cols}, 51), dtype);
        const Tensor w = ops::to(normal({cols}, 52), dtype), b = ops::to(normal({cols}, 53), dtype);
        const Tensor gy = ops::to(normal({rows, cols}, 54), dtype), gs = ops::to(normal({rows, cols}, 55), dtype);
        const Tensor x_dev = dev(x), delta_dev = dev(delta), w_dev = dev(w), b_dev = dev(b), gy_dev = dev(gy),
                     gs_dev = dev(gs);

        // The fused op against add then layer_norm on the device: the same bits
        // (f16 composes those two; the others run the fused kernels).
        const ops::AddNormOutput fused = ops::add_layer_norm(x_dev, delta_dev, w_dev, b_dev, 1e-5);
        const Tensor sum = ops::add(x_dev, delta_dev);
        const ops::NormOutput unfused = ops::layer_norm(sum, w_dev, b_dev, 1e-5);
        CHECK(fused.sum.dtype() == dtype);
        CHECK(values_of(fused.sum) == values_of(sum));
        CHECK(values_of(fused.norm.y) == values_of(unfused.y));
        CHECK(values_of(fused.norm.mean) == values_of(unfused.mean));
        CHECK(values_of(fused.norm.rstd) == values_of(unfused.rstd));
        const ops::NormGrads fused_grads =
            ops::add_layer_norm_backward(gs_dev, gy_dev, fused.sum, w_dev, fused.norm.mean, fused.norm.rstd, true);
        const ops::NormGrads norm_grads = ops::layer_norm_backward(gy_dev, sum, w_dev, unfused.mean, unfused.rstd, true);
        CHECK(values_of(fused_grads.x) == values_of(ops::add(gs_dev, norm_grads.x)));
        CHECK(values_of(fused_grads.weight) == values_of(norm_grads.weight));
        CHECK(values_of(fused_grads.bias) == values_of(norm_grads.bias));
        if (dtype == DType::bf16 || dtype == DType::f16) continue;  // their norms: the bf16 test above

        // Against the cpu: the sum exactly (one IEEE add on both), the rest as
        // the layer_norm test above bounds them; grad_x's residual adds one
        // rounding of |grad_x| to the bound.
        const ops::AddNormOutput cpu = ops::add_layer_norm(x, delta, w, b, 1e-5);
        CHECK(values_of(fused.sum) == values_of(cpu.sum));
        const double depth = norm_sum_depth(cols, dtype);
        std::vector<double> scale = values_of(ops::add(ops::abs(w), ops::abs(b)));
        for (double& s : scale) s += 1.0;
        check_within("y", fused.norm.y, cpu.norm.y, depth, dtype, scale);
        check_within("rstd", fused.norm.rstd, cpu.norm.rstd, depth, dtype, {0.0});
        check_within("mean", fused.norm.mean, cpu.norm.mean, depth, dtype, {3.0});
        const ops::NormGrads cpu_grads =
            ops::add_layer_norm_backward(gs, gy, cpu.sum, w, cpu.norm.mean, cpu.norm.rstd, true);
        std::vector<double> gx_scale = row_max_abs(ops::mul(gy, w), cols);
        const std::vector<double> rstd = values_of(cpu.norm.rstd);
        for (size_t i = 0; i < gx_scale.size(); ++i) gx_scale[i] *= 16.0 * rstd[i / cols];
        check_within("grad_x", fused_grads.x, cpu_grads.x, depth + 1.0, dtype, gx_scale);
        std::vector<double> column_scale(static_cast<size_t>(cols), 0.0);
        const std::vector<double> gyv = values_of(gy);
        for (size_t i = 0; i < gyv.size(); ++i) column_scale[i % cols] += 5.0 * std::abs(gyv[i]);
        check_within("grad_weight", fused_grads.weight, cpu_grads.weight, static_cast<double>(rows), dtype, column_scale);
        check_within("grad_bias", fused_grads.bias, cpu_grads.bias, static_cast<double>(rows), dtype, column_scale);
      }
    }
  }
}

TEST_CASE("add_layer_norm on cuda in bf16: the norm reads the sum rounded to bf16") {
  // 1 + 2^-8 ties to even in bf16: 1. The rounded sum {1, -1, 0, 0} has mean
  // 0 and its zeros stay 0; the f32 sum's mean (2^-10) would move them.
  const auto bf16_row = [](const std::vector<double>& values) {
    return ops::to(ops::from_vector(values, {1, 4}, {.dtype = DType::bf16}), kCuda);
  };
  const Tensor a = bf16_row({1.0, -1.0, 0.0, 0.0}), b = bf16_row({0.00390625, 0.0, 0.0, 0.0});
  const ops::AddNormOutput out = ops::add_layer_norm(a, b, Tensor(), Tensor(), 0.0);
  CHECK(values_of(out.sum) == values_of(a));
  CHECK(values_of(out.norm.mean) == std::vector<double>{0.0});
  CHECK(values_of(out.norm.y) == values_of(ops::layer_norm(a, Tensor(), Tensor(), 0.0).y));
  CHECK(values_of(ops::narrow(out.norm.y, 1, 2, 2)) == std::vector<double>{0.0, 0.0});
}

#if TESSERA_HAVE_CUDA_SIM
TEST_CASE("add_layer_norm on cuda: one launch forward and two backward, one fewer each than add and layer_norm") {
  const int64_t rows = 64, cols = 256;
  const auto dev = [](const Tensor& t) { return ops::to(ops::to(t, DType::bf16), kCuda); };
  const Tensor x = dev(normal({rows, cols}, 60)), delta = dev(normal({rows, cols}, 61));
  const Tensor w = dev(normal({cols}, 62)), b = dev(normal({cols}, 63));
  const Tensor gy = dev(normal({rows, cols}, 64)), gs = dev(normal({rows, cols}, 65));
  const auto launches = [](const std::function<void()>& run) {
    int64_t total = 0;
    for (const auto& [name, count] : tessera::testing::launch_counts(run)) total += count;
    return total;
  };
  ops::AddNormOutput fused;
  CHECK(launches([&] { fused = ops::add_layer_norm(x, delta, w, b, 1e-5); }) == 1);
  CHECK(launches([&] { ops::layer_norm(ops::add(x, delta), w, b, 1e-5); }) == 2);
  const Tensor mean = fused.norm.mean, rstd = fused.norm.rstd;
  CHECK(launches([&] { ops::add_layer_norm_backward(gs, gy, fused.sum, w, mean, rstd, true); }) == 2);
  CHECK(launches([&] { ops::add(gs, ops::layer_norm_backward(gy, fused.sum, w, mean, rstd, true).x); }) == 3);
}
#endif

TEST_CASE("TransformerBlock on cuda in bf16: the fused residual add and ln2 give the unfused block's bits") {
  manual_seed(17);
  nn::TransformerBlock block(64, 2, {.init_std = 0.3, .device = kCuda, .dtype = DType::bf16});
  Tensor x = ops::to(ops::to(normal({2, 5, 64}, 70), DType::bf16), kCuda);
  x.set_requires_grad(true);
  const Tensor g = ops::to(ops::to(normal({2, 5, 64}, 71), DType::bf16), kCuda);
  autograd::TensorList inputs{x};
  for (const auto& [name, parameter] : block.named_parameters()) inputs.push_back(parameter->tensor());
  const Tensor fused = block(x);
  REQUIRE(fused.grad_fn()->next_edges()[0].node->name() == "AddLayerNormBackward");
  const autograd::TensorList fused_grads = autograd::grad({fused}, inputs, {g});
  auto hook = block.ln2().register_forward_hook(
      [](nn::Module&, const nn::TensorList&, const Tensor&) { return std::optional<Tensor>(); });
  const Tensor unfused = block(x);
  REQUIRE(unfused.grad_fn()->next_edges()[0].node->name() == "AddBackward");
  const autograd::TensorList unfused_grads = autograd::grad({unfused}, inputs, {g});
  hook.remove();
  CHECK(values_of(fused.detach()) == values_of(unfused.detach()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    CAPTURE(i);
    CHECK(values_of(fused_grads[i]) == values_of(unfused_grads[i]));
  }
}

TEST_CASE("add_layer_norm refuses operands on two devices, naming them") {
  const Tensor x = ops::zeros({2, 8}, {.device = kCuda}), w = ops::ones({8}, {.device = kCuda});
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, ops::zeros({2, 8}), w, Tensor(), 1e-5),
                       "add_layer_norm: delta is on cpu, x on cuda:0", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, x, ops::ones({8}), Tensor(), 1e-5),
                       "add_layer_norm: weight is on cpu, expected cuda:0", Error);
  const ops::AddNormOutput out = ops::add_layer_norm(x, x, w, Tensor(), 1e-5);
  CHECK_THROWS_WITH_AS(
      ops::add_layer_norm_backward(ops::zeros({2, 8}), x, out.sum, w, out.norm.mean, out.norm.rstd, false),
      "add_layer_norm_backward: grad_sum is on cpu, sum on cuda:0", Error);
}

TEST_CASE("row kernels: errors for bad shapes and dtypes") {
  const KernelTable& cuda = kernels(kCuda);
  const auto on_device = [](const Shape& shape, DType dtype) {
    return ops::zeros(shape, {.dtype = dtype, .device = kCuda});
  };
  CHECK_THROWS_WITH_AS(cuda.softmax(on_device({2, 3}, DType::i32), on_device({2, 3}, DType::i32), false),
                       doctest::Contains("cuda::softmax: computes in f32, f64 or bf16, got i32"), Error);
  CHECK_THROWS_WITH_AS(cuda.softmax(on_device({2, 3}, DType::f32), ops::transpose(on_device({3, 2}, DType::f32), 0, 1), false),
                       doctest::Contains("cuda::softmax: x must be contiguous f32"), Error);
  const Tensor x = on_device({2, 5000}, DType::f32), stats = on_device({2}, DType::f32);
  CHECK_THROWS_WITH_AS(cuda.norm(on_device({2, 5000}, DType::f32), stats, stats, x, Tensor(), Tensor(), 1e-5),
                       doctest::Contains("take rows of at most 4096 features"), Error);
  const Tensor xb = on_device({2, 8}, DType::bf16);
  CHECK_THROWS_WITH_AS(cuda.norm(on_device({2, 8}, DType::bf16), Tensor(), on_device({2}, DType::bf16), xb, Tensor(), Tensor(), 1e-5),
                       doctest::Contains("cuda::norm: rstd must be contiguous f32 with 2 elements, got bf16"), Error);
  CHECK_THROWS_WITH_AS(cuda.norm_backward(on_device({2, 8}, DType::f32), on_device({7}, DType::f32), Tensor(),
                                          on_device({2, 8}, DType::f32), on_device({2, 8}, DType::f32), Tensor(), Tensor(), stats),
                       doctest::Contains("grad_weight must be contiguous f32 with 8 elements, got f32 of shape [7]"), Error);
  const Tensor x8 = on_device({2, 8}, DType::f32);
  CHECK_THROWS_WITH_AS(cuda.add_norm(x8, x8, stats, stats, x8, xb, Tensor(), Tensor(), 1e-5),
                       doctest::Contains("cuda::add_norm: delta must be contiguous f32 with 16 elements, got bf16"),
                       Error);
  CHECK_THROWS_WITH_AS(
      cuda.add_norm(on_device({3, 8}, DType::f32), x8, stats, stats, x8, x8, Tensor(), Tensor(), 1e-5),
      doctest::Contains("cuda::add_norm: sum must be contiguous f32 with 16 elements, got f32 of shape [3, 8]"), Error);
  CHECK_THROWS_WITH_AS(
      cuda.norm_backward_add(x8, Tensor(), Tensor(), on_device({2, 7}, DType::f32), x8, x8, Tensor(), stats, stats),
      doctest::Contains("cuda::norm_backward_add: grad_residual must be contiguous f32 with 16 elements"), Error);
  const Tensor logits = on_device({2, 5}, DType::f32);
  CHECK_THROWS_WITH_AS(cuda.cross_entropy(on_device({}, DType::f32), stats, logits, on_device({2}, DType::f32), -100, 5),
                       doctest::Contains("cuda::cross_entropy: targets must be i32 or i64, got f32"), Error);
  CHECK_THROWS_WITH_AS(cuda.cross_entropy(on_device({}, DType::f32), on_device({3}, DType::f32), logits, on_device({2}, DType::i64), -100, 5),
                       doctest::Contains("cuda::cross_entropy: logsumexp must be contiguous f32 with 2 elements"), Error);
  CHECK_THROWS_WITH_AS(cuda.cross_entropy(on_device({}, DType::f32), stats, on_device({2, 5, 1}, DType::f32), on_device({2}, DType::i64), -100, 5),
                       doctest::Contains("cuda::cross_entropy: logits must be [rows, classes], got [2, 5, 1]"), Error);
  // A bad target is found on the device and raised at the next read (deferred_errors.h).
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, ops::to(ops::from_vector(std::vector<int64_t>{0, 5}, {2}), kCuda)).item(),
                       doctest::Contains("cross_entropy: target 5 out of range for 5 classes"), Error);
}

TEST_CASE("row kernels move at most 1.1x their ideal bytes") {
  const KernelTable& cuda = kernels(kCuda);
  const int64_t rows = 256, cols = 768, n = rows * cols;
  const auto device = [](const Tensor& t) { return ops::to(ops::to(t, DType::f32), kCuda); };
  const auto empty = [](const Shape& shape) { return ops::empty(shape, {.device = kCuda}); };
  const Tensor x = device(normal({rows, cols}, 31)), g = device(normal({rows, cols}, 32));
  const Tensor w = device(normal({cols}, 33)), b = device(normal({cols}, 34));
  const Tensor y = empty({rows, cols}), dx = empty({rows, cols}), mean = empty({rows}), rstd = empty({rows});
  const Tensor gw = empty({cols}), gb = empty({cols});
  const auto check_ratio = [](const char* what, const std::optional<CountedBytes>& counted, int64_t ideal) {
    if (!counted) return;
    const double ratio = static_cast<double>(counted->total()) / static_cast<double>(ideal);
    MESSAGE(std::string(what) << ": " << counted->total() << " bytes, ideal " << ideal << ", ratio " << ratio);
    CHECK(counted->total() >= ideal);
    CHECK(ratio <= 1.1);
  };
  check_ratio("softmax", counted_bytes([&] { cuda.softmax(y, x, false); }), 2 * n * 4);
  check_ratio("log_softmax", counted_bytes([&] { cuda.softmax(y, x, true); }), 2 * n * 4);
  check_ratio("softmax_backward", counted_bytes([&] { cuda.softmax_backward(dx, g, y, false); }), 3 * n * 4);
  check_ratio("layer_norm", counted_bytes([&] { cuda.norm(y, mean, rstd, x, w, b, 1e-5); }),
              (2 * n + 2 * cols + 2 * rows) * 4);
  check_ratio("rms_norm", counted_bytes([&] { cuda.norm(y, Tensor(), rstd, x, w, Tensor(), 1e-5); }),
              (2 * n + cols + rows) * 4);
  check_ratio("layer_norm_backward", counted_bytes([&] { cuda.norm_backward(dx, gw, gb, g, x, w, mean, rstd); }),
              (3 * n + 3 * cols + 2 * rows) * 4);
  check_ratio("rms_norm_backward", counted_bytes([&] { cuda.norm_backward(dx, gw, Tensor(), g, x, w, Tensor(), rstd); }),
              (3 * n + 2 * cols + rows) * 4);
  // The residual add fused in: x and delta read, sum and y written; g, x and the residual gradient read, dx written.
  const Tensor sum = empty({rows, cols});
  check_ratio("add_layer_norm", counted_bytes([&] { cuda.add_norm(sum, y, mean, rstd, x, g, w, b, 1e-5); }),
              (4 * n + 2 * cols + 2 * rows) * 4);
  check_ratio("layer_norm_backward_add",
              counted_bytes([&] { cuda.norm_backward_add(dx, gw, gb, x, g, sum, w, mean, rstd); }),
              (4 * n + 3 * cols + 2 * rows) * 4);

  const int64_t ce_rows = 8, vocab = 50257;
  const Tensor logits = device(normal({ce_rows, vocab}, 35, 3.0));
  const Tensor targets = ops::to(ops::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 50256}, {ce_rows}), kCuda);
  const Tensor loss = empty({}), lse = empty({ce_rows}), grad = empty({ce_rows, vocab}), grad_loss = ops::ones({}, {.device = kCuda});
  // logits read once; targets, logsumexp and the loss are 8 + 4 + 4/rows bytes a row.
  check_ratio("cross_entropy", counted_bytes([&] { cuda.cross_entropy(loss, lse, logits, targets, -100, vocab); }),
              ce_rows * vocab * 4 + ce_rows * (8 + 4) + 4);
  check_ratio("cross_entropy_backward",
              counted_bytes([&] { cuda.cross_entropy_backward(grad, grad_loss, logits, lse, targets, -100, vocab); }),
              2 * ce_rows * vocab * 4 + ce_rows * (8 + 4) + 4);
}

TEST_CASE("gradcheck of softmax, log_softmax, layer_norm, rms_norm, add_layer_norm and cross_entropy on cuda, in f64") {
  const auto leaf = [](const Shape& shape, uint64_t stream, double scale) {
    Tensor on_device = ops::to(normal(shape, 40 + stream, scale), kCuda);
    on_device.set_requires_grad(true);
    return on_device;
  };
  const Tensor x = leaf({3, 33}, 1, 1.0), w = leaf({33}, 2, 1.0), b = leaf({33}, 3, 1.0);
  const Tensor targets = ops::to(ops::from_vector(std::vector<int64_t>{5, -100, 32}, {3}), kCuda);
  using autograd::TensorList;
  using Function = std::function<Tensor(const TensorList&)>;
  const Tensor weights = ops::to(normal({3, 33}, 9), kCuda);  // a weighted sum tests every output's gradient
  struct Case {
    const char* name;
    Function function;
    TensorList inputs;  // only what the function uses: gradcheck perturbs each element
  };
  const std::vector<Case> cases = {
      {"softmax", [&](const TensorList& t) { return mul(softmax(t[0], -1), weights); }, {x}},
      {"log_softmax", [&](const TensorList& t) { return mul(log_softmax(t[0], 1), weights); }, {x}},
      {"softmax along dim 0", [&](const TensorList& t) { return mul(softmax(t[0], 0), weights); }, {x}},
      {"layer_norm", [&](const TensorList& t) { return mul(layer_norm(t[0], t[1], t[2], 1e-5), weights); }, {x, w, b}},
      {"rms_norm", [&](const TensorList& t) { return mul(rms_norm(t[0], t[1], 1e-6), weights); }, {x, w}},
      {"add_layer_norm (sum and normalized)",
       [&](const TensorList& t) {
         const AddLayerNormOutput out = add_layer_norm(t[0], t[1], t[2], t[3], 1e-5);
         return stack({mul(out.sum, weights), mul(out.normalized, weights)}, 0);
       },
       {x, leaf({3, 33}, 4, 1.0), w, b}},
      {"cross_entropy (ignore_index)", [&](const TensorList& t) { return cross_entropy(t[0], targets); }, {x}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const autograd::GradcheckResult result = autograd::gradcheck(c.function, c.inputs);
    CHECK_MESSAGE(result.ok, result.report);
  }
}
