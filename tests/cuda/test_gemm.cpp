// matmul and linear on the cuda device through cuBLASLt (tensor/cuda/blas_lt.h),
// against the cpu: layouts (transposed views, leading dimensions, strided and
// broadcast batches, operands that need a copy), dtypes, every epilogue,
// alpha/beta, TF32, the descriptor checks and the stream-ordering checker.
//
// Tolerances. A GEMM that accumulates K products in precision eps (the
// spacing at 1, 2u) is within gamma_K sum_k |a||b| ~= K u sum_k |a||b| of the
// exact product, in any summation order; two of them (the device's and the
// cpu's, which sum in different orders) are within K eps sum_k |a||b| of each
// other. Anything rounded once more to bf16/f16 moves by at most half its
// ulp: 2^-8 (bf16) or 2^-11 (f16) of its magnitude.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <map>
#include <string>
#include <cstring>
#include <vector>

#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "tensor/cuda/blas_lt.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/architecture.h"
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

using namespace tessera;
using cuda::GemmDescriptor;
using cuda::GemmEpilogue;
using cuda::GemmMatrix;
using cuda::GemmOp;

namespace {

const Device kCuda(DeviceType::cuda);
constexpr double kEps32 = std::numeric_limits<float>::epsilon();
constexpr double kEps64 = std::numeric_limits<double>::epsilon();

Tensor random(const Shape& shape, uint64_t stream, DType dtype = DType::f32) {
  return ops::to(ops::randn(shape, PhiloxKey{1414, stream}), dtype);
}

std::vector<double> values_of(const Tensor& tensor) {
  const Tensor dense = ops::contiguous(ops::to(ops::to(tensor, kCPU), DType::f64));
  const double* data = dense.data_ptr<double>();
  return std::vector<double>(data, data + dense.numel());
}

// The largest |got - want| / bound over all elements: at most 1 passes.
double worst_ratio(const Tensor& got, const Tensor& want, const Tensor& bound) {
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> g = values_of(got), w = values_of(want), b = values_of(ops::expand(bound, want.sizes()));
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double error = std::abs(g[i] - w[i]);
    worst = std::max(worst, error == 0 ? 0.0 : error / b[i]);
    if (std::isnan(g[i]) != std::isnan(w[i])) worst = std::numeric_limits<double>::infinity();
  }
  return worst;
}

Tensor f64(const Tensor& t) { return ops::to(ops::to(t, kCPU), DType::f64); }
Tensor scalar(double value) { return ops::full({}, value, {.dtype = DType::f64}); }

// sum_k |a||b| for every output element, in f64 on the cpu.
Tensor magnitude(const Tensor& a, const Tensor& b) { return ops::matmul(ops::abs(f64(a)), ops::abs(f64(b))); }

using View = std::function<Tensor(const Tensor&)>;
const View kSame = [](const Tensor& t) { return t; };
const View kTransposed = [](const Tensor& t) { return ops::transpose(t, -1, -2); };

struct LayoutCase {
  const char* name;
  Shape a_base, b_base;
  View a_view = kSame, b_view = kSame;
};

const std::vector<LayoutCase>& layout_cases() {
  static const std::vector<LayoutCase> cases = {
      {"1x1 @ 1x1", {1, 1}, {1, 1}},
      {"odd sizes", {5, 7}, {7, 3}},
      {"past a tile", {33, 17}, {17, 65}},
      {"one row", {1, 40}, {40, 9}},
      {"one column", {9, 40}, {40, 1}},
      {"K = 1 (outer product)", {64, 1}, {1, 31}},
      {"vector @ matrix", {7}, {7, 3}},
      {"matrix @ vector", {5, 7}, {7}},
      {"dot product", {19}, {19}},
      {"a transposed", {7, 5}, {7, 3}, kTransposed},
      {"b transposed (x @ W^T)", {5, 7}, {3, 7}, kSame, kTransposed},
      {"both transposed", {7, 6}, {3, 7}, kTransposed, kTransposed},
      {"batched", {3, 5, 7}, {3, 7, 4}},
      {"batched, b transposed", {3, 5, 7}, {3, 4, 7}, kSame, kTransposed},
      {"batch of rows @ shared matrix (one tall GEMM)", {4, 5, 7}, {7, 3}},
      {"batch of rows @ shared transposed matrix", {4, 5, 7}, {3, 7}, kSame, kTransposed},
      {"a broadcast over the batch (stride 0)", {1, 5, 7}, {4, 7, 3}},
      {"two broadcast batch dims (a copy)", {2, 1, 5, 7}, {3, 7, 4}},
      {"a with a stride-2 last dim (a copy)", {5, 14}, {7, 3},
       [](const Tensor& t) { return ops::slice(t, 1, 0, 14, 2); }},
      {"b with no unit stride (a copy)", {5, 7}, {7, 3, 2}, kSame,
       [](const Tensor& t) { return ops::select(t, 2, 1); }},
      {"a batch sliced out of a larger one", {6, 5, 7}, {7, 3},
       [](const Tensor& t) { return ops::slice(t, 0, 0, 6, 2); }},
      {"empty inner dim", {4, 0}, {0, 3}},
  };
  return cases;
}

// Runs one layout case in `dtype` and returns the worst error against the
// bound (see the file comment).
double layout_case_ratio(const LayoutCase& c, DType dtype, uint64_t seed) {
  const Tensor a_base = random(c.a_base, seed, dtype), b_base = random(c.b_base, seed + 1, dtype);
  const Tensor a = c.a_view(a_base), b = c.b_view(b_base);
  const Tensor got = ops::matmul(c.a_view(ops::to(a_base, kCuda)), c.b_view(ops::to(b_base, kCuda)));
  CHECK(got.device() == kCuda);
  CHECK(got.dtype() == dtype);
  const int64_t k = a.size(-1);
  const Tensor sum = magnitude(a, b);
  if (dtype == DType::f32 || dtype == DType::f64) {
    const double eps = dtype == DType::f32 ? kEps32 : kEps64;
    const Tensor bound = ops::add(ops::mul(sum, scalar(1.01 * k * eps)), scalar(1e-300));
    return worst_ratio(got, ops::matmul(a, b), bound);
  }
  // bf16/f16 inputs: the f32 product of the same (rounded) inputs, then one rounding.
  const Tensor want = ops::matmul(ops::to(a, DType::f32), ops::to(b, DType::f32));
  const double half_ulp = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const Tensor accumulation = ops::mul(sum, scalar(1.01 * k * kEps32));
  const Tensor bound = ops::add(ops::add(ops::mul(ops::add(ops::abs(f64(want)), accumulation), scalar(half_ulp)),
                                         accumulation),
                                scalar(1e-300));
  return worst_ratio(got, want, bound);
}

// out [rows, features] = x [rows, in] @ w [features, in]^T in cuBLASLt's
// column-major terms, as kernel_table.cpp maps ops::linear: D = out^T
// ([features x rows], ld features), A = w read through op T, B = x^T.
GemmDescriptor linear_descriptor(const Tensor& out, const Tensor& x, const Tensor& w) {
  const int64_t rows = x.size(0), in = x.size(1), features = w.size(0);
  GemmDescriptor g;
  g.op_a = GemmOp::transpose;
  g.op_b = GemmOp::none;
  g.m = features, g.n = rows, g.k = in;
  g.a = GemmMatrix{w.cuda_data(), w.dtype(), in, features, in, 0};
  g.b = GemmMatrix{x.cuda_data(), x.dtype(), in, rows, in, 0};
  g.d = GemmMatrix{out.cuda_data(), out.dtype(), features, rows, features, 0};
  g.c = g.d;
  g.c.data = nullptr;
  return g;
}

// tanh-approximated GELU and its derivative, in f64 on the cpu.
Tensor gelu_reference(const Tensor& x) { return ops::gelu(x, GeluApproximation::tanh); }
Tensor gelu_derivative_reference(const Tensor& x) {
  return ops::gelu_backward(ops::ones_like(x), x, GeluApproximation::tanh);
}

void run(const GemmDescriptor& g) { cuda::gemm(g, current_stream(kCuda)); }

}  // namespace

TEST_CASE("gemm: matmul on cuda equals the cpu's for every layout, in f32 within K eps sum|a||b|") {
  uint64_t seed = 0;
  for (const LayoutCase& c : layout_cases()) {
    CAPTURE(c.name);
    const double ratio = layout_case_ratio(c, DType::f32, seed += 2);
    CHECK(ratio <= 1.0);
  }
}

TEST_CASE("gemm: f64 matmul on cuda within K eps64 sum|a||b| of the cpu's; bf16 and f16 accumulate in f32") {
  uint64_t seed = 100;
  for (const DType dtype : {DType::f64, DType::bf16, DType::f16}) {
    for (const LayoutCase& c : layout_cases()) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(c.name);
      const double ratio = layout_case_ratio(c, dtype, seed += 2);
      CHECK(ratio <= 1.0);
    }
  }
  // 4099 ones: an f32 accumulator holds 4099 exactly and one rounding gives
  // bf16's 4096 and f16's 4100; a 16-bit accumulator would stall (bf16 at
  // 256, f16 at 2048).
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const Tensor ones_row = ops::ones({1, 4099}, {.dtype = dtype, .device = kCuda});
    const Tensor ones_col = ops::ones({4099, 1}, {.dtype = dtype, .device = kCuda});
    CHECK(ops::matmul(ones_row, ones_col).item() == (dtype == DType::bf16 ? 4096.0 : 4100.0));
  }
}

TEST_CASE("gemm: linear on cuda (bias epilogue) equals the cpu's; bf16 goes to the GEMM as bf16") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = random({2, 9, 19}, 1, dtype), w = random({24, 19}, 2, dtype), b = random({24}, 3, dtype);
    const Tensor got = ops::linear(ops::to(x, kCuda), ops::to(w, kCuda), ops::to(b, kCuda));
    const Tensor want = ops::linear(x, w, b);  // the cpu: f32 product + bias, one rounding
    const Tensor product = ops::matmul(f64(x), ops::transpose(f64(w), 0, 1));
    const Tensor sum = ops::add(magnitude(x, ops::transpose(w, 0, 1)), ops::abs(f64(b)));
    const Tensor accumulation = ops::mul(sum, scalar(1.01 * 20 * kEps32));
    // bf16: the cpu rounds product + bias once; cuBLASLt rounds the product
    // to bf16 first (half an ulp of |product|, 2^-8 relative), then the sum
    // (each result within half an ulp of its value: 2^-7 of |want| between them).
    const double rounding = dtype == DType::bf16 ? std::ldexp(1.0, -7) : 0.0;
    const double product_rounding = dtype == DType::bf16 ? std::ldexp(1.0, -8) : 0.0;
    const Tensor bound = ops::add(ops::add(ops::add(ops::mul(ops::abs(f64(want)), scalar(rounding)),
                                                    ops::mul(ops::abs(product), scalar(product_rounding))),
                                           accumulation),
                                  scalar(1e-300));
    const double worst = worst_ratio(got, want, bound);
    if (worst > 1.0) {  // what the epilogue did there: tells its roundings apart on a GPU
      const std::vector<double> on_cuda = values_of(got), on_cpu = values_of(want), bias = values_of(b),
                                exact = values_of(product);
      size_t at = 0;
      for (size_t i = 0; i < on_cuda.size(); ++i) {
        if (std::abs(on_cuda[i] - on_cpu[i]) > std::abs(on_cuda[at] - on_cpu[at])) at = i;
      }
      MESSAGE("largest difference at ", at, ": cuda ", on_cuda[at], ", cpu ", on_cpu[at], ", x w^T in f64 ",
              exact[at], ", bias ", bias[at % bias.size()]);
    }
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("gemm: a bf16 bias epilogue may round the product to bf16 before adding the bias, as an H100 did") {
  // x w^T = 1 + 2^-8 + 2^-10 (exact in f32), bias 2^-8. One rounding of the
  // sum (1 + 2^-7 + 2^-10) gives 1 + 2^-7; rounding the product first gives
  // 1 + 2^-7, plus the bias 1 + 2^-7 + 2^-8: a tie, to even, 1 + 2^-6.
  // (cuBLASLt 13.0 on an H100, tools/gpu_check.sh, 2026-11-26; the
  // simulator's twin: tensor/cuda/sim/blas_lt.cpp.)
  const Tensor x = ops::from_vector(std::vector<double>{1.0, std::ldexp(1.25, -8)}, {1, 2}, {.dtype = DType::bf16});
  const Tensor w = ops::from_vector(std::vector<double>{1.0, 1.0}, {1, 2}, {.dtype = DType::bf16});
  const Tensor b = ops::full({1}, std::ldexp(1.0, -8), {.dtype = DType::bf16});
  CHECK(ops::linear(x, w, b).item() == 1.0 + std::ldexp(1.0, -7));
  // cuBLASLt picks its kernel by shape, and kernels differ: this 1x1x2
  // product came back rounded once on an H100, a 18x24x19 one (the test
  // above) twice. The simulator's twin rounds twice.
  const double on_cuda = ops::linear(ops::to(x, kCuda), ops::to(w, kCuda), ops::to(b, kCuda)).item();
  CHECK((on_cuda == 1.0 + std::ldexp(1.0, -6) || on_cuda == 1.0 + std::ldexp(1.0, -7)));
#if TESSERA_HAVE_CUDA_SIM
  CHECK(on_cuda == 1.0 + std::ldexp(1.0, -6));
#endif
  // f32 D: one rounding on both.
  const Tensor x32 = ops::to(x, DType::f32), w32 = ops::to(w, DType::f32), b32 = ops::to(b, DType::f32);
  CHECK(ops::linear(ops::to(x32, kCuda), ops::to(w32, kCuda), ops::to(b32, kCuda)).item() ==
        ops::linear(x32, w32, b32).item());
}

TEST_CASE("gemm: every epilogue against a plain reference; alpha and beta, in place too") {
  const int64_t rows = 13, in = 19, features = 24;
  const Tensor x = random({rows, in}, 11), w = random({features, in}, 12), b = random({features}, 13);
  const Tensor x_d = ops::to(x, kCuda), w_d = ops::to(w, kCuda), b_d = ops::to(b, kCuda);
  const Tensor product = ops::matmul(f64(x), ops::transpose(f64(w), 0, 1));  // [rows, features]
  const Tensor sum = magnitude(x, ops::transpose(w, 0, 1));
  const double k_eps = 1.01 * (in + 1) * kEps32;

  for (const GemmEpilogue epilogue : {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::gelu,
                                      GemmEpilogue::gelu_aux, GemmEpilogue::gelu_bias, GemmEpilogue::gelu_aux_bias}) {
    CAPTURE(static_cast<int>(epilogue));
    const bool with_bias =
        epilogue == GemmEpilogue::bias || epilogue == GemmEpilogue::gelu_bias || epilogue == GemmEpilogue::gelu_aux_bias;
    const bool with_gelu = epilogue != GemmEpilogue::none && epilogue != GemmEpilogue::bias;
    const bool with_aux = epilogue == GemmEpilogue::gelu_aux || epilogue == GemmEpilogue::gelu_aux_bias;
    const Tensor out = ops::empty({rows, features}, {.device = kCuda});
    const Tensor aux = ops::empty({rows, features}, {.device = kCuda});
    GemmDescriptor g = linear_descriptor(out, x_d, w_d);
    g.epilogue = epilogue;
    if (with_bias) g.bias = b_d.cuda_data();
    if (with_aux) g.aux = aux.cuda_data(), g.aux_ld = features;
    run(g);
    const Tensor pre = with_bias ? ops::add(product, f64(b)) : product;
    const Tensor pre_bound = ops::mul(with_bias ? ops::add(sum, ops::abs(f64(b))) : sum, scalar(k_eps));
    if (with_aux) CHECK(worst_ratio(aux, pre, ops::add(pre_bound, scalar(1e-300))) <= 1.0);
    // GELU's slope is at most 1.13; evaluating it in f32 costs a few ulp of |pre|.
    const Tensor want = with_gelu ? gelu_reference(pre) : pre;
    const Tensor bound = with_gelu ? ops::add(ops::mul(pre_bound, scalar(1.13)), ops::mul(ops::abs(pre), scalar(16 * kEps32)))
                                   : pre_bound;
    CHECK(worst_ratio(out, want, ops::add(bound, scalar(1e-300))) <= 1.0);
  }

  SUBCASE("DGELU: the product times GELU'(aux)") {
    const Tensor z = random({rows, features}, 14);
    const Tensor out = ops::empty({rows, features}, {.device = kCuda});
    const Tensor z_d = ops::to(z, kCuda);
    GemmDescriptor g = linear_descriptor(out, x_d, w_d);
    g.epilogue = GemmEpilogue::dgelu;
    g.aux = z_d.cuda_data(), g.aux_ld = features;
    run(g);
    const Tensor slope = gelu_derivative_reference(f64(z));
    const Tensor want = ops::mul(product, slope);
    const Tensor bound = ops::add(ops::mul(ops::mul(sum, ops::abs(slope)), scalar(k_eps)),
                                  ops::mul(ops::mul(ops::abs(product), ops::add(ops::mul(f64(z), f64(z)), scalar(1.0))),
                                           scalar(16 * kEps32)));
    CHECK(worst_ratio(out, want, ops::add(bound, scalar(1e-300))) <= 1.0);
  }

  SUBCASE("BGRADB: the weight gradient g^T x and the bias gradient sum_rows(g) in one call") {
    // dW [features, in] = g^T x: D = dW^T [in x features], A = x^T (op N on
    // x's row-major storage), B = g (op T); BGRADB sums op(B) over k = rows.
    const Tensor grad = random({rows, features}, 15);
    const Tensor grad_d = ops::to(grad, kCuda);
    const Tensor dw = ops::empty({features, in}, {.device = kCuda}), db = ops::empty({features}, {.device = kCuda});
    GemmDescriptor g;
    g.op_a = GemmOp::none, g.op_b = GemmOp::transpose;
    g.m = in, g.n = features, g.k = rows;
    g.a = GemmMatrix{x_d.cuda_data(), DType::f32, in, rows, in, 0};
    g.b = GemmMatrix{grad_d.cuda_data(), DType::f32, features, rows, features, 0};
    g.d = GemmMatrix{dw.cuda_data(), DType::f32, in, features, in, 0};
    g.c = g.d, g.c.data = nullptr;
    g.epilogue = GemmEpilogue::bgradb;
    g.bias = db.cuda_data();
    run(g);
    const Tensor dw_want = ops::matmul(ops::transpose(f64(grad), 0, 1), f64(x));
    const Tensor dw_bound = ops::mul(magnitude(ops::transpose(grad, 0, 1), x), scalar(1.01 * rows * kEps32));
    CHECK(worst_ratio(dw, dw_want, ops::add(dw_bound, scalar(1e-300))) <= 1.0);
    const Tensor db_bound = ops::mul(ops::sum(ops::abs(f64(grad)), {0}), scalar(1.01 * rows * kEps32));
    CHECK(worst_ratio(db, ops::sum(f64(grad), {0}), ops::add(db_bound, scalar(1e-300))) <= 1.0);
  }

  SUBCASE("alpha and beta, with C apart from D and in place") {
    const Tensor c = random({rows, features}, 16);
    for (const bool in_place : {false, true}) {
      CAPTURE(in_place);
      const Tensor c_d = ops::to(c, kCuda);
      const Tensor out = in_place ? c_d : ops::empty({rows, features}, {.device = kCuda});
      GemmDescriptor g = linear_descriptor(out, x_d, w_d);
      g.alpha = 0.5, g.beta = -2.0;
      g.c = g.d;
      g.c.data = c_d.cuda_data();
      run(g);
      const Tensor want = ops::add(ops::mul(product, scalar(0.5)), ops::mul(f64(c), scalar(-2.0)));
      const Tensor bound = ops::mul(ops::add(ops::mul(sum, scalar(0.5)), ops::mul(ops::abs(f64(c)), scalar(2.0))),
                                    scalar(k_eps));
      CHECK(worst_ratio(out, want, ops::add(bound, scalar(1e-300))) <= 1.0);
    }
  }
}

TEST_CASE("gemm: TF32 is off unless asked for; on, inputs round to 10 mantissa bits, to nearest, ties to even") {
  REQUIRE_FALSE(cuda::allow_tf32());
  // Two probes between the TF32 values 1 and 1 + 2^-10: the tie 1 + 2^-11 and
  // 1 + 3 * 2^-12 above it. Truncation gives 1 and 1; ties to even 1 and
  // 1 + 2^-10; ties away (cvt.rna) 1 + 2^-10 twice. Allowing TF32 lets
  // cuBLASLt use it, not forces it: an H100 ran a 1x1x1 product in f32 and a
  // 17x300x9 one on TF32 tensor cores, which gave 1 and 1 + 2^-10: ties to
  // even (tools/gpu_check.sh, 2026-11-26). So the probes sit inside the larger
  // product: row p of `left` is zero but for the probe in column p, and
  // right[p][0] = 1, so out[p][0] is the probe as the GEMM read it.
  const double tie = 1.0 + std::ldexp(1.0, -11), above = 1.0 + 3 * std::ldexp(1.0, -12);
  const Tensor a = ops::full({1, 1}, tie, {.device = kCuda}), b = ops::ones({1, 1}, {.device = kCuda});
  CHECK(ops::matmul(a, b).item() == tie);
  Tensor left = random({17, 300}, 31), right = random({300, 9}, 32);
  for (int64_t probe = 0; probe < 2; ++probe) {
    Tensor row = ops::select(left, 0, probe);
    ops::fill_(row, 0.0);
    Tensor value = ops::slice(row, 0, probe, probe + 1), one = ops::slice(ops::select(right, 1, 0), 0, probe, probe + 1);
    ops::fill_(value, probe == 0 ? tie : above);
    ops::fill_(one, 1.0);
  }
  cuda::set_allow_tf32(true);
  const double tiny_result = ops::matmul(a, b).item();
  const Tensor tf32_got = ops::to(ops::matmul(ops::to(left, kCuda), ops::to(right, kCuda)), kCPU);
  cuda::set_allow_tf32(false);
  CHECK((tiny_result == tie || tiny_result == 1.0 || tiny_result == 1.0 + std::ldexp(1.0, -10)));
  const double tie_result = tf32_got.to_vector<float>()[0], above_result = tf32_got.to_vector<float>()[9];
  MESSAGE("TF32 probes: 1 + 2^-11 -> 1 + ", (tie_result - 1) * 1024, " * 2^-10; 1 + 3 * 2^-12 -> 1 + ",
          (above_result - 1) * 1024, " * 2^-10");
  CHECK(tie_result == 1.0);
  CHECK(above_result == 1.0 + std::ldexp(1.0, -10));
  // The whole product against the f32 product of the inputs rounded the same way on the host.
  const auto round_tf32 = [](const Tensor& t) {  // 10 mantissa bits, to nearest, ties to even
    Tensor rounded = ops::clone(t);
    for (float& v : std::span<float>(rounded.data_ptr<float>(), static_cast<size_t>(rounded.numel()))) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      bits = (bits + 0xfffu + ((bits >> 13) & 1u)) & 0xffffe000u;
      std::memcpy(&v, &bits, sizeof bits);
    }
    return rounded;
  };
  const Tensor want = ops::matmul(round_tf32(left), round_tf32(right));
  const Tensor bound = ops::mul(magnitude(left, right), scalar(1.01 * 300 * kEps32));
  CHECK(worst_ratio(tf32_got, want, bound) <= 1.0);
  // Off again, the same product is the f32 one.
  const Tensor f32_got = ops::matmul(ops::to(left, kCuda), ops::to(right, kCuda));
  CHECK(worst_ratio(f32_got, ops::matmul(left, right), bound) <= 1.0);
  CHECK(ops::amax(ops::abs(ops::sub(ops::to(f32_got, kCPU), tf32_got))).item() > 0);
}

TEST_CASE("gemm: gradcheck of matmul and linear on cuda, in f64") {
  const auto leaf = [](const Shape& shape, uint64_t stream) {
    Tensor on_device = ops::to(random(shape, stream, DType::f64), kCuda);
    on_device.set_requires_grad(true);
    return on_device;
  };
  using autograd::TensorList;
  const autograd::GradcheckResult batched = autograd::gradcheck(
      [](const TensorList& t) { return matmul(t[0], transpose(t[1], -1, -2)); },
      {leaf({2, 3, 4}, 41), leaf({5, 4}, 42)});
  CHECK_MESSAGE(batched.ok, batched.report);
  const autograd::GradcheckResult linear_result = autograd::gradcheck(
      [](const TensorList& t) { return linear(t[0], t[1], t[2]); }, {leaf({2, 3, 4}, 43), leaf({5, 4}, 44), leaf({5}, 45)});
  CHECK_MESSAGE(linear_result.ok, linear_result.report);
}

#if TESSERA_HAVE_CUDA_SIM
TEST_CASE("gemm: ops::linear with a bias is one cublasLtMatmul (simulator counters)") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = ops::to(random({4, 8, 32}, 51, dtype), kCuda), w = ops::to(random({48, 32}, 52, dtype), kCuda);
    const Tensor b = ops::to(random({48}, 53, dtype), kCuda);
    current_stream(kCuda)->synchronize();
    cuda::sim::reset_kernel_counters();
    ops::linear(x, w, b);
    current_stream(kCuda)->synchronize();
    const auto counters = cuda::sim::kernel_counters();
    REQUIRE(counters.size() == 1);
    const cuda::sim::KernelCounters& gemm = counters.at("cublasLtMatmul");
    CHECK(gemm.launches == 1);
    CHECK(gemm.flops == 2 * 32 * 48 * 32);
    const int64_t element = dtype == DType::f32 ? 4 : 2;
    CHECK(gemm.device_bytes_read == (32 * 32 + 48 * 32 + 48) * element);  // x, W, bias, once each
    CHECK(gemm.device_bytes_written == 32 * 48 * element);
  }
}

TEST_CASE("gemm: FP8 products run as one cuBLASLt FP8 GEMM on sm_90, the cpu's contract; on sm_80 the same values") {
  // Float8 operands [M, K] and [N, K] with their inverse scales, as float8_linear makes them.
  const Tensor a_values = random({32, 48}, 61), b_values = random({16, 48}, 62);
  const Tensor a_scale = ops::float8_scale(a_values, DType::f8e4m3);
  const Tensor b_scale = ops::float8_scale(b_values, DType::f8e5m2);
  const Tensor a = ops::to_float8(a_values, a_scale, DType::f8e4m3);
  const Tensor b = ops::to_float8(b_values, b_scale, DType::f8e5m2);
  const Tensor a_inverse = ops::div(ops::full({}, 1.0), a_scale), b_inverse = ops::div(ops::full({}, 1.0), b_scale);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor on_cpu = ops::float8_linear_product(a, b, a_inverse, b_inverse, dtype);
    current_stream(kCuda)->synchronize();
    cuda::sim::reset_kernel_counters();
    const Tensor on_cuda = ops::float8_linear_product(ops::to(a, kCuda), ops::to(b, kCuda), ops::to(a_inverse, kCuda),
                                                      ops::to(b_inverse, kCuda), dtype);
    current_stream(kCuda)->synchronize();
    const auto counters = cuda::sim::kernel_counters();
    REQUIRE(counters.count("cublasLtMatmul") == 1);
    CHECK(counters.at("cublasLtMatmul").launches == 1);
    CHECK(counters.at("cublasLtMatmul").device_bytes_read == (32 * 48 + 16 * 48) * 1 + 2 * 4);  // 1 byte an element
    // The exact float8 products summed in f32 in each side's order: within K f32 ulps of the largest term sums.
    const std::vector<double> cpu = values_of(on_cpu), cuda = values_of(on_cuda);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      worst = std::max(worst, std::fabs(cpu[i] - cuda[i]));
      scale = std::max(scale, std::fabs(cpu[i]));
    }
    CHECK(worst <= (dtype == DType::f32 ? 48 * 6e-8 : 8e-3) * scale);
  }
  // An A100 (sm_80) has no FP8 GEMM: the same contract from ops, no cublasLtMatmul of float8.
  cuda::sim::set_target_architecture(cuda::sim::architecture_named("sm_80"));
  const Tensor fallback = ops::float8_linear_product(ops::to(a, kCuda), ops::to(b, kCuda), ops::to(a_inverse, kCuda),
                                                    ops::to(b_inverse, kCuda), DType::f32);
  cuda::sim::set_target_architecture(cuda::sim::sm_90());
  const std::vector<double> cpu = values_of(ops::float8_linear_product(a, b, a_inverse, b_inverse, DType::f32));
  const std::vector<double> from_ops = values_of(fallback);
  for (size_t i = 0; i < cpu.size(); ++i) CHECK(std::fabs(from_ops[i] - cpu[i]) <= 1e-5 * (1.0 + std::fabs(cpu[i])));
  // Shapes cuBLASLt's FP8 kernels do not take (K = 40) go through ops too.
  const Tensor odd = ops::to_float8(random({16, 40}, 63), a_scale, DType::f8e4m3);
  CHECK(ops::float8_linear_product(ops::to(odd, kCuda), ops::to(odd, kCuda), ops::to(a_inverse, kCuda),
                                   ops::to(a_inverse, kCuda), DType::f32).sizes() == Shape{16, 16});
}

TEST_CASE("gemm: the simulator refuses FP8 GEMMs cuBLASLt refuses: not TN, K not a multiple of 16, e5m2 x e5m2") {
  const Tensor a = ops::to(ops::zeros({32, 32}, {.dtype = DType::f8e4m3}), kCuda);
  const Tensor e5m2 = ops::to(ops::zeros({32, 32}, {.dtype = DType::f8e5m2}), kCuda);
  const Tensor out = ops::empty({32, 32}, {.device = kCuda});
  const Tensor scale = ops::ones({}, {.device = kCuda});
  GemmDescriptor good;
  good.op_a = cuda::GemmOp::transpose, good.op_b = cuda::GemmOp::none;
  good.m = good.n = good.k = 32;
  good.a = cuda::GemmMatrix{a.cuda_data(), DType::f8e4m3, 32, 32, 32, 0};
  good.b = cuda::GemmMatrix{a.cuda_data(), DType::f8e4m3, 32, 32, 32, 0};
  good.d = cuda::GemmMatrix{out.cuda_data(), DType::f32, 32, 32, 32, 0};
  good.c = cuda::GemmMatrix{nullptr, DType::f32, 32, 32, 32, 0};
  good.a_scale = good.b_scale = scale.cuda_data();
  run(good);
  const auto refuses = [](GemmDescriptor g, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(run(g), doctest::Contains(message), Error);
  };
  GemmDescriptor g = good;
  g.op_a = cuda::GemmOp::none;
  refuses(g, "FP8 takes op_a CUBLAS_OP_T and op_b CUBLAS_OP_N");
  g = good;
  g.k = 24, g.a.rows = 24, g.b.rows = 24;
  refuses(g, "each must be a multiple of 16");
  g = good;
  g.a.data = g.b.data = e5m2.cuda_data();
  g.a.dtype = g.b.dtype = DType::f8e5m2;
  refuses(g, "FP8 multiplies e4m3 by e4m3 or e5m2");
  g = good;
  g.b_scale = nullptr;
  refuses(g, "FP8 needs CUBLASLT_MATMUL_DESC_A_SCALE_POINTER");
  g = good;
  g.d.dtype = DType::f64, g.c.dtype = DType::f64;
  refuses(g, "FP8 writes D as f32, bf16 or f16");
  current_stream(kCuda)->synchronize();
}

TEST_CASE("gemm: the simulator refuses what cuBLASLt refuses, naming the field") {
  const Tensor x = ops::zeros({6, 8}, {.device = kCuda}), w = ops::zeros({16, 8}, {.device = kCuda});
  const Tensor out = ops::empty({6, 16}, {.device = kCuda});
  const GemmDescriptor good = linear_descriptor(out, x, w);
  const auto refuses = [](GemmDescriptor g, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(run(g), doctest::Contains(message), Error);
  };
  GemmDescriptor g = good;
  g.a.ld = 4;
  refuses(g, "A.ld = 4 is below max(1, rows) = 8");
  g = good;
  g.d.ld = 15;
  refuses(g, "D.ld = 15 is below max(1, rows) = 16");
  g = good;
  g.op_a = GemmOp::none;
  refuses(g, "A layout is [8 x 16] (rows x cols) but op_a CUBLAS_OP_N with m = 16, k = 8 needs [16 x 8]");
  const Tensor x16 = ops::zeros({6, 8}, {.dtype = DType::f16, .device = kCuda});
  const Tensor w16 = ops::zeros({16, 8}, {.dtype = DType::bf16, .device = kCuda});
  refuses(linear_descriptor(out, x16, w16), "A is bf16 and B is f16");
  g = linear_descriptor(out, ops::zeros({6, 8}, {.dtype = DType::bf16, .device = kCuda}), w16);
  g.d.dtype = DType::f16, g.c.dtype = DType::f16;
  refuses(g, "bf16 A and B with CUBLAS_COMPUTE_32F write D as bf16 or f32, not f16");
  g = good;
  g.compute = cuda::GemmCompute::f64;
  refuses(g, "compute CUBLAS_COMPUTE_64F takes f64 A, B, C, D");
  g = good;
  g.epilogue = GemmEpilogue::gelu_aux;
  g.aux = out.cuda_data();
  refuses(g, "aux_ld = 0 with epilogue CUBLASLT_EPILOGUE_GELU_AUX");
  g.aux_ld = 20;
  refuses(g, "must be set, a multiple of 8 and at least m = 16");
  g = good;
  g.epilogue = GemmEpilogue::bias;
  refuses(g, "epilogue CUBLASLT_EPILOGUE_BIAS needs CUBLASLT_MATMUL_DESC_BIAS_POINTER");
  g = good;
  g.beta = 1.0;
  refuses(g, "beta = 1 reads C, but C's pointer is null");
  g = good;
  g.batch_count = 2, g.d.batch_stride = 10;
  refuses(g, "D.batch_stride = 10 makes batches of the [16 x 6] D (ld 16) overlap");

  // Epilogue combinations: none with f64 compute; batched outputs of an
  // epilogue that overlap; and any pointer off its element alignment.
  const Tensor x64 = ops::zeros({6, 8}, {.dtype = DType::f64, .device = kCuda});
  const Tensor w64 = ops::zeros({16, 8}, {.dtype = DType::f64, .device = kCuda});
  const Tensor out64 = ops::empty({6, 16}, {.dtype = DType::f64, .device = kCuda});
  const Tensor bias64 = ops::zeros({16}, {.dtype = DType::f64, .device = kCuda});
  g = linear_descriptor(out64, x64, w64);
  g.compute = cuda::GemmCompute::f64;
  CHECK_NOTHROW(run(g));
  g.epilogue = GemmEpilogue::bias, g.bias = bias64.cuda_data();
  refuses(g, "epilogue CUBLASLT_EPILOGUE_BIAS with CUBLAS_COMPUTE_64F");
  const Tensor bias = ops::zeros({16}, {.device = kCuda});
  g = good;
  g.batch_count = 2, g.d.batch_stride = 96;
  g.epilogue = GemmEpilogue::bgradb, g.bias = bias.cuda_data();
  refuses(g, "epilogue CUBLASLT_EPILOGUE_BGRADB with batch_count = 2 writes a bias gradient of n = 6 per batch, but "
             "bias_batch_stride = 0 makes them overlap");
  g = good;
  g.batch_count = 2, g.d.batch_stride = 96;
  g.epilogue = GemmEpilogue::gelu_aux, g.aux = out.cuda_data(), g.aux_ld = 16;
  refuses(g, "epilogue CUBLASLT_EPILOGUE_GELU_AUX with batch_count = 2 writes an aux matrix [16 x 6] (ld 16) per "
             "batch, but aux_batch_stride = 0 makes them overlap");
  g = good;
  g.a.data = static_cast<const char*>(g.a.data) + 2;
  refuses(g, "is not aligned to its 4-byte f32 elements");
  g = good;
  g.epilogue = GemmEpilogue::bias, g.bias = static_cast<char*>(bias.cuda_data()) + 6;
  refuses(g, "the bias pointer");
}

TEST_CASE("gemm: the stream-ordering checker refuses a GEMM reading a buffer another stream wrote without an event") {
  const auto producer = Stream::create(kCuda), consumer = Stream::create(kCuda);
  Tensor x = ops::empty({6, 8}, {.device = kCuda});
  const Tensor w = ops::ones({16, 8}, {.device = kCuda});
  current_stream(kCuda)->synchronize();  // w's fill is known to the host
  {
    StreamGuard on_producer(producer);
    ops::fill_(x, 1.0);
  }
  {
    StreamGuard on_consumer(consumer);
    CHECK_THROWS_WITH_AS(ops::matmul(x, ops::transpose(w, 0, 1)),
                         doctest::Contains("`cublasLtMatmul` on cuda:0 stream"), Error);
    Event written;
    written.record(*producer);
    consumer->wait_event(written);
    const Tensor y = ops::matmul(x, ops::transpose(w, 0, 1));
    CHECK(ops::sum(y).item() == 6 * 16 * 8);
  }
  producer->synchronize();
  consumer->synchronize();
}
#endif
