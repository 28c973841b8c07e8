// The GELU MLP's fused GEMMs on cuda (tensor/ops.h: linear_gelu,
// matmul_gelu_backward, linear_weight_backward; tessera::linear_gelu_linear)
// against the unfused composition and an f64 reference, in f32 and bf16;
// one cublasLtMatmul per fused op and no GELU or column-sum kernels
// (simulator counters); the composition where cuBLASLt's epilogues do not
// apply (N not a multiple of 8, f64); a gradcheck on cuda; the errors.
//
// Bounds. Each result is held to its exact value (the same inputs, in f64 on
// the cpu) within a per-element bound E that the fused and the unfused path
// both meet, so the two are also held within 2E of each other. E is built
// stage by stage from: a k-term f32 GEMM is within gamma_k |A||B| of exact,
// gamma_k = 1.01 k eps32 (test_gemm.cpp); storing a value rounds it by u of
// its magnitude (bf16 2^-8, f32 2^-24), twice for a product rounded before
// its bias is added (cuBLASLt's bias epilogue, sim/blas_lt.cpp); an error e
// in an operand moves a product by |e||B|; |GELU'| <= 1.13 and |GELU''| <= 0.8,
// so an error e in pre moves gelu(pre) by 1.13 e and gelu'(pre) by 0.8 e; and
// evaluating GELU in f32 costs 16 eps32 |pre|, GELU' 16 eps32 (1 + pre^2)
// (test_gemm.cpp's epilogue bounds).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

#include "tests/cuda/counted_bytes.h"

using namespace tessera;
using tessera::autograd::TensorList;
using tessera::testing::launched_kernels;

namespace {

const Device kCuda(DeviceType::cuda);
constexpr double kEps32 = std::numeric_limits<float>::epsilon();

Tensor f64(const Tensor& t) { return ops::to(ops::to(t.detach(), kCPU), DType::f64); }
Tensor absolute(const Tensor& t) { return ops::abs(f64(t)); }
Tensor scaled(const Tensor& t, double factor) { return ops::mul(t, factor); }

// N(0, std) values rounded to `dtype`, on the cpu: exact inputs for both sides.
Tensor normal(const Shape& shape, uint64_t stream, DType dtype, double std = 1.0) {
  return ops::to(ops::mul(ops::randn(shape, PhiloxKey{2828, stream}, {.dtype = DType::f64}), std), dtype);
}

Tensor on_cuda_leaf(const Tensor& t) {
  Tensor leaf = ops::to(t, kCuda);
  leaf.set_requires_grad(true);
  return leaf;
}

// The largest |got - want| / bound: at most 1 passes.
double worst_ratio(const Tensor& got, const Tensor& want, const Tensor& bound) {
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> g = f64(got).to_vector<double>(), w = f64(want).to_vector<double>();
  const std::vector<double> b = ops::contiguous(ops::expand(f64(bound), want.sizes())).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double error = std::abs(g[i] - w[i]);
    if (!std::isfinite(g[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, error == 0 ? 0.0 : error / b[i]);
  }
  return worst;
}

double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24); }
double gamma(int64_t k) { return 1.01 * static_cast<double>(k) * kEps32; }

// gelu and gelu' in f64 on the cpu.
Tensor gelu_exact(const Tensor& x) { return ops::gelu(x, GeluApproximation::tanh); }
Tensor gelu_slope(const Tensor& x) { return ops::gelu_backward(ops::ones_like(x), x, GeluApproximation::tanh); }

// 16 eps32 (1 + pre^2): evaluating gelu' in f32.
Tensor slope_evaluation(const Tensor& pre) { return scaled(ops::add(ops::mul(pre, pre), 1.0), 16 * kEps32); }

// The MLP core's inputs (exact in `dtype`) and each result's exact value
// with its bound E, over rows x: [R, in].
struct Mlp {
  Tensor x, w1, b1, w2, b2, g;  // x: [2, 5, in], g: [2, 5, out]
};

struct Exact {
  Tensor value, bound;
};

struct MlpReference {
  Exact pre, h, y, grad_pre, dx, dw1, db1, dw2, db2;
};

Mlp mlp_inputs(int64_t in, int64_t hidden, int64_t out, DType dtype, uint64_t seed) {
  return Mlp{normal({2, 5, in}, seed, dtype),
             normal({hidden, in}, seed + 1, dtype, 1.0 / std::sqrt(static_cast<double>(in))),
             normal({hidden}, seed + 2, dtype, 0.5),
             normal({out, hidden}, seed + 3, dtype, 1.0 / std::sqrt(static_cast<double>(hidden))),
             normal({out}, seed + 4, dtype, 0.5),
             normal({2, 5, out}, seed + 5, dtype)};
}

MlpReference reference(const Mlp& m, DType dtype) {
  const double u = unit_roundoff(dtype);
  const int64_t in = m.w1.size(1), hidden = m.w1.size(0), out = m.w2.size(0);
  const Tensor x = ops::reshape(f64(m.x), {-1, in}), g = ops::reshape(f64(m.g), {-1, out});
  const int64_t rows = x.size(0);
  const Tensor w1 = f64(m.w1), w2 = f64(m.w2), w1_t = ops::transpose(w1, 0, 1), w2_t = ops::transpose(w2, 0, 1);
  const Tensor ax = ops::abs(x), ag = ops::abs(g), aw1 = ops::abs(w1), aw2 = ops::abs(w2);
  const auto rows_to = [](const Tensor& t, const Tensor& like) { return ops::reshape(t, like.sizes()); };
  MlpReference r;
  // pre = x W1^T + b1; h = gelu(pre); y = h W2^T + b2
  const Tensor pre = ops::add(ops::matmul(x, w1_t), f64(m.b1));
  const Tensor pre_magnitude = ops::add(ops::matmul(ax, ops::transpose(aw1, 0, 1)), absolute(m.b1));
  const Tensor e_pre = scaled(pre_magnitude, gamma(in + 1) + 2.02 * u);
  const Tensor h = gelu_exact(pre);
  Tensor e_h = ops::add(scaled(e_pre, 1.14), scaled(ops::abs(pre), 16 * kEps32));
  e_h = ops::add(e_h, scaled(ops::add(ops::abs(h), e_h), u));
  const Tensor y = ops::add(ops::matmul(h, w2_t), f64(m.b2));
  const Tensor y_magnitude =
      ops::add(ops::matmul(ops::add(ops::abs(h), e_h), ops::transpose(aw2, 0, 1)), absolute(m.b2));
  const Tensor e_y = ops::add(ops::matmul(e_h, ops::transpose(aw2, 0, 1)), scaled(y_magnitude, gamma(hidden + 1) + 2.02 * u));
  r.pre = {rows_to(pre, ops::empty({2, 5, hidden})), rows_to(e_pre, ops::empty({2, 5, hidden}))};
  r.h = {rows_to(h, ops::empty({2, 5, hidden})), rows_to(e_h, ops::empty({2, 5, hidden}))};
  r.y = {rows_to(y, m.g), rows_to(e_y, m.g)};
  // db2 = sum_rows(g); dW2 = g^T h
  const Tensor sum_g = ops::sum(ag, {0});
  r.db2 = {ops::sum(g, {0}), scaled(sum_g, gamma(rows) + u)};
  const Tensor g_t = ops::transpose(g, 0, 1), ag_t = ops::transpose(ag, 0, 1);
  r.dw2 = {ops::matmul(g_t, h), ops::add(ops::matmul(ag_t, e_h),
                                         scaled(ops::matmul(ag_t, ops::add(ops::abs(h), e_h)), gamma(rows) + u))};
  // grad_h = g W2; grad_pre = grad_h * gelu'(pre)
  const Tensor grad_h = ops::matmul(g, w2), e_grad_h = scaled(ops::matmul(ag, aw2), gamma(out) + u);
  const Tensor grad_pre = ops::mul(grad_h, gelu_slope(pre));
  Tensor e_grad_pre = ops::add(scaled(e_grad_h, 1.14),
                               ops::mul(ops::add(ops::abs(grad_h), e_grad_h),
                                        ops::add(scaled(e_pre, 0.8), slope_evaluation(pre))));
  e_grad_pre = ops::add(e_grad_pre, scaled(ops::add(ops::abs(grad_pre), e_grad_pre), u));
  const Tensor grad_pre_magnitude = ops::add(ops::abs(grad_pre), e_grad_pre);
  r.grad_pre = {rows_to(grad_pre, ops::empty({2, 5, hidden})), rows_to(e_grad_pre, ops::empty({2, 5, hidden}))};
  // db1 = sum_rows(grad_pre); dW1 = grad_pre^T x; dx = grad_pre W1
  r.db1 = {ops::sum(grad_pre, {0}),
           ops::add(ops::sum(e_grad_pre, {0}), scaled(ops::sum(grad_pre_magnitude, {0}), gamma(rows) + u))};
  const Tensor e_t = ops::transpose(e_grad_pre, 0, 1), magnitude_t = ops::transpose(grad_pre_magnitude, 0, 1);
  r.dw1 = {ops::matmul(ops::transpose(grad_pre, 0, 1), x),
           ops::add(ops::matmul(e_t, ax), scaled(ops::matmul(magnitude_t, ax), gamma(rows) + u))};
  r.dx = {rows_to(ops::matmul(grad_pre, w1), m.x),
          rows_to(ops::add(ops::matmul(e_grad_pre, aw1), scaled(ops::matmul(grad_pre_magnitude, aw1), gamma(hidden) + u)),
                  m.x)};
  return r;
}

struct MlpRun {
  Tensor y, dx, dw1, db1, dw2, db2;
};

// y and the gradients of sum(y * g), on cuda, through `core`.
template <typename Core>
MlpRun run_mlp(const Mlp& m, Core core) {
  const Tensor x = on_cuda_leaf(m.x), w1 = on_cuda_leaf(m.w1), b1 = on_cuda_leaf(m.b1);
  const Tensor w2 = on_cuda_leaf(m.w2), b2 = on_cuda_leaf(m.b2);
  const Tensor y = core(x, w1, b1, w2, b2);
  const TensorList grads = autograd::grad({y}, {x, w1, b1, w2, b2}, {ops::to(m.g, kCuda)});
  return MlpRun{y, grads[0], grads[1], grads[2], grads[3], grads[4]};
}

Tensor fused_core(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  return linear_gelu_linear(x, w1, b1, w2, b2);
}

Tensor unfused_core(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  return linear(gelu(linear(x, w1, b1), GeluApproximation::tanh), w2, b2);
}

// fused and unfused within E of exact, and within 2E of each other.
void check_pair(const char* what, const Tensor& fused, const Tensor& unfused, const Exact& exact) {
  CAPTURE(what);
  CHECK(worst_ratio(fused, exact.value, exact.bound) <= 1.0);
  CHECK(worst_ratio(unfused, exact.value, exact.bound) <= 1.0);
  CHECK(worst_ratio(fused, unfused, scaled(exact.bound, 2.0)) <= 1.0);
}

[[maybe_unused]] bool has_kernel(const std::vector<std::string>& names, const std::string& part) {
  for (const std::string& name : names) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

#if TESSERA_HAVE_CUDA_SIM
// Launches per kernel name that `run` makes on cuda.
std::map<std::string, int64_t> launches_of(const std::function<void()>& run) {
  current_stream(kCuda)->synchronize();
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(kCuda)->synchronize();
  std::map<std::string, int64_t> launches;
  for (const auto& [name, counter] : cuda::sim::kernel_counters()) launches[name] = counter.launches;
  return launches;
}

std::vector<std::string> names_of(const std::map<std::string, int64_t>& launches) {
  std::vector<std::string> names;
  for (const auto& [name, count] : launches) names.push_back(name);
  return names;
}

int64_t total(const std::map<std::string, int64_t>& launches) {
  int64_t sum = 0;
  for (const auto& [name, count] : launches) sum += count;
  return sum;
}
#endif

}  // namespace

TEST_CASE("linear_gelu_linear on cuda: y and every gradient within rounding of exact, fused or composed alike") {
  // hidden 32 takes the GELU epilogues; 20 (not a multiple of 8) composes.
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const int64_t hidden : {32, 20}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(hidden);
      const Mlp m = mlp_inputs(24, hidden, 16, dtype, 10 * static_cast<uint64_t>(hidden));
      const MlpReference exact = reference(m, dtype);
      const MlpRun fused = run_mlp(m, fused_core), unfused = run_mlp(m, unfused_core);
      CHECK(fused.y.dtype() == dtype);
      check_pair("y", fused.y, unfused.y, exact.y);
      check_pair("dx", fused.dx, unfused.dx, exact.dx);
      check_pair("dW1", fused.dw1, unfused.dw1, exact.dw1);
      check_pair("db1", fused.db1, unfused.db1, exact.db1);
      check_pair("dW2", fused.dw2, unfused.dw2, exact.dw2);
      check_pair("db2", fused.db2, unfused.db2, exact.db2);
    }
  }
}

TEST_CASE("ops::linear_gelu on cuda: one GEMM writes y and pre; N not a multiple of 8, and f64, compose linear and gelu") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Mlp m = mlp_inputs(24, 32, 16, dtype, 500);
    const MlpReference exact = reference(m, dtype);
    // x as a transposed view: its rows are copied dense, then fused.
    const Tensor x = ops::to(m.x, kCuda), x_t = ops::transpose(ops::contiguous(ops::transpose(x, 0, 2)), 0, 2);
    const Tensor w = ops::to(m.w1, kCuda), b = ops::to(m.b1, kCuda);
    for (const Tensor& input : {x, x_t}) {
      CAPTURE(input.is_contiguous());
      ops::LinearGeluOutput out;
      [[maybe_unused]] const std::vector<std::string> names =
          launched_kernels([&] { out = ops::linear_gelu(input, w, b); });
      CHECK(worst_ratio(out.pre, exact.pre.value, exact.pre.bound) <= 1.0);
      CHECK(worst_ratio(out.y, exact.h.value, exact.h.bound) <= 1.0);
#if TESSERA_HAVE_CUDA_SIM
      CHECK_FALSE(has_kernel(names, "unary"));
      CHECK(has_kernel(names, "cublasLtMatmul"));
      // GELU_AUX_BIAS rounds x W^T + b once, as an H100 did (sim/blas_lt.cpp): pre is the f32 linear's, rounded.
      const Tensor pre_f32 = ops::linear(ops::to(x, DType::f32), ops::to(w, DType::f32), ops::to(b, DType::f32));
      CHECK(f64(out.pre).to_vector<double>() == f64(ops::to(pre_f32, dtype)).to_vector<double>());
#endif
    }
#if TESSERA_HAVE_CUDA_SIM
    CHECK(launches_of([&] { ops::linear_gelu(x, w, b); }) == std::map<std::string, int64_t>{{"cublasLtMatmul", 1}});
    CHECK(launches_of([&] { ops::linear_gelu(x, w, Tensor()); }) ==
          std::map<std::string, int64_t>{{"cublasLtMatmul", 1}});
#endif
  }
  // Where the epilogue does not apply: exactly linear then gelu, the same kernels.
  for (const auto& [dtype, hidden] : {std::pair{DType::f32, int64_t{20}}, std::pair{DType::f64, int64_t{32}}}) {
    CAPTURE(dtype_name(dtype));
    const Mlp m = mlp_inputs(24, hidden, 16, dtype, 600);
    const Tensor x = ops::to(m.x, kCuda), w = ops::to(m.w1, kCuda), b = ops::to(m.b1, kCuda);
    ops::LinearGeluOutput out;
    [[maybe_unused]] const std::vector<std::string> names =
        launched_kernels([&] { out = ops::linear_gelu(x, w, b); });
    const Tensor pre = ops::linear(x, w, b);
    CHECK(f64(out.pre).to_vector<double>() == f64(pre).to_vector<double>());
    CHECK(f64(out.y).to_vector<double>() == f64(ops::gelu(pre, GeluApproximation::tanh)).to_vector<double>());
#if TESSERA_HAVE_CUDA_SIM
    CHECK(has_kernel(names, "unary"));
#endif
  }
}

TEST_CASE("ops::matmul_gelu_backward and linear_weight_backward on cuda: one GEMM each, no elementwise or column-sum pass") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Mlp m = mlp_inputs(24, 32, 16, dtype, 700);
    const MlpReference exact = reference(m, dtype);
    const Tensor g = ops::to(m.g, kCuda), w2 = ops::to(m.w2, kCuda), x = ops::to(m.x, kCuda);
    const Tensor pre = ops::linear(x, ops::to(m.w1, kCuda), ops::to(m.b1, kCuda));  // as the forward stores it
    const Tensor h = ops::gelu(pre, GeluApproximation::tanh);
    Tensor grad_pre;
    [[maybe_unused]] const std::vector<std::string> names =
        launched_kernels([&] { grad_pre = ops::matmul_gelu_backward(g, w2, pre); });
    check_pair("grad_pre", grad_pre, ops::gelu_backward(ops::matmul(g, w2), pre, GeluApproximation::tanh),
               exact.grad_pre);
    ops::LinearWeightGrads grads;
    [[maybe_unused]] const std::vector<std::string> weight_names =
        launched_kernels([&] { grads = ops::linear_weight_backward(g, h, true); });
    const Tensor g_rows = ops::reshape(g, {10, 16});
    check_pair("dW2", grads.weight, ops::matmul(ops::transpose(g_rows, 0, 1), ops::reshape(h, {10, 32})), exact.dw2);
    check_pair("db2", grads.bias, ops::sum(g_rows, {0}), exact.db2);
    const ops::LinearWeightGrads no_bias = ops::linear_weight_backward(g, h, false);
    CHECK_FALSE(no_bias.bias.defined());
    CHECK(worst_ratio(no_bias.weight, exact.dw2.value, exact.dw2.bound) <= 1.0);
#if TESSERA_HAVE_CUDA_SIM
    CHECK(names == std::vector<std::string>{"cublasLtMatmul"});
    CHECK(weight_names == std::vector<std::string>{"cublasLtMatmul"});
    CHECK(launches_of([&] { ops::matmul_gelu_backward(g, w2, pre); }) ==
          std::map<std::string, int64_t>{{"cublasLtMatmul", 1}});
    CHECK(launches_of([&] { ops::linear_weight_backward(g, h, true); }) ==
          std::map<std::string, int64_t>{{"cublasLtMatmul", 1}});
#endif
  }
  // Where the epilogues do not apply: exactly the composition, the same kernels.
  for (const auto& [dtype, hidden] : {std::pair{DType::f32, int64_t{20}}, std::pair{DType::f64, int64_t{32}}}) {
    CAPTURE(dtype_name(dtype));
    const Mlp m = mlp_inputs(24, hidden, 16, dtype, 800);
    const Tensor g = ops::to(m.g, kCuda), w2 = ops::to(m.w2, kCuda), h = ops::to(normal({2, 5, hidden}, 801, dtype), kCuda);
    const Tensor pre = ops::to(normal({2, 5, hidden}, 802, dtype), kCuda);
    Tensor grad_pre;
    [[maybe_unused]] const std::vector<std::string> names =
        launched_kernels([&] { grad_pre = ops::matmul_gelu_backward(g, w2, pre); });
    CHECK(f64(grad_pre).to_vector<double>() ==
          f64(ops::gelu_backward(ops::matmul(g, w2), pre, GeluApproximation::tanh)).to_vector<double>());
#if TESSERA_HAVE_CUDA_SIM
    CHECK(has_kernel(names, "unary_backward"));
#endif
    if (dtype != DType::f64) continue;  // BGRADB needs no aux: only f64 composes the weight gradients
    ops::LinearWeightGrads grads;
    [[maybe_unused]] const std::vector<std::string> weight_names =
        launched_kernels([&] { grads = ops::linear_weight_backward(g, h, true); });
    const Tensor g_rows = ops::reshape(g, {10, 16});
    CHECK(f64(grads.weight).to_vector<double>() ==
          f64(ops::matmul(ops::transpose(g_rows, 0, 1), ops::reshape(h, {10, hidden}))).to_vector<double>());
    CHECK(f64(grads.bias).to_vector<double>() == f64(ops::sum(g_rows, {0})).to_vector<double>());
#if TESSERA_HAVE_CUDA_SIM
    CHECK(has_kernel(weight_names, "reduce"));
#endif
  }
}

#if TESSERA_HAVE_CUDA_SIM
TEST_CASE("linear_gelu_linear on cuda: its backward is four GEMMs, with no GELU-backward or column-sum kernel") {
  // GPT-2's MLP shape scaled down (C = 64, hidden 4C), bf16 as it trains.
  const Mlp m = mlp_inputs(64, 256, 64, DType::bf16, 900);
  const Tensor x = on_cuda_leaf(m.x), w1 = on_cuda_leaf(m.w1), b1 = on_cuda_leaf(m.b1);
  const Tensor w2 = on_cuda_leaf(m.w2), b2 = on_cuda_leaf(m.b2), g = ops::to(m.g, kCuda);
  const TensorList inputs{x, w1, b1, w2, b2};
  for (const bool fused : {true, false}) {
    CAPTURE(fused);
    Tensor y;
    const std::map<std::string, int64_t> forward =
        launches_of([&] { y = fused ? fused_core(x, w1, b1, w2, b2) : unfused_core(x, w1, b1, w2, b2); });
    const std::map<std::string, int64_t> backward = launches_of([&] { autograd::grad({y}, inputs, {g}); });
    std::string listing;
    for (const auto& [name, count] : backward) listing += fmt::format(" {} x{};", name, count);
    MESSAGE(std::string(fused ? "fused" : "unfused"), " MLP core: forward ", total(forward), " launches (",
            forward.at("cublasLtMatmul"), " GEMMs), backward ", total(backward), " launches:", listing);
    if (fused) {
      CHECK(forward == std::map<std::string, int64_t>{{"cublasLtMatmul", 2}});
      CHECK(backward == std::map<std::string, int64_t>{{"cublasLtMatmul", 4}});
    } else {  // what the fusion removes: the GELU pass and its backward (Linear's bias gradients are BGRADB too)
      CHECK(has_kernel(names_of(forward), "unary"));
      CHECK(has_kernel(names_of(backward), "unary_backward"));
      CHECK_FALSE(has_kernel(names_of(backward), "reduce"));
    }
  }
}
#endif

TEST_CASE("linear_gelu_linear on cuda: gradcheck in f64 (the composed path: no f64 epilogues)") {
  const auto leaf = [](const Shape& shape, uint64_t stream) { return on_cuda_leaf(normal(shape, stream, DType::f64)); };
  const autograd::GradcheckResult result = autograd::gradcheck(
      [](const TensorList& t) { return linear_gelu_linear(t[0], t[1], t[2], t[3], t[4]); },
      {leaf({2, 3, 4}, 1001), leaf({8, 4}, 1002), leaf({8}, 1003), leaf({5, 8}, 1004), leaf({5}, 1005)});
  CHECK_MESSAGE(result.ok, result.report);
}

TEST_CASE("linear_gelu_linear and its ops on cuda refuse operands on two devices, naming them") {
  const Tensor x = ops::zeros({2, 4}, {.device = kCuda}), w1 = ops::zeros({8, 4}, {.device = kCuda});
  const Tensor w2 = ops::zeros({3, 8}, {.device = kCuda});
  CHECK_THROWS_WITH_AS(ops::linear_gelu(x, ops::zeros({8, 4}), Tensor()),
                       "linear_gelu: operands on different devices: cuda:0 and cpu", Error);
  CHECK_THROWS_WITH_AS(ops::linear_gelu(x, w1, ops::zeros({8})), "linear_gelu: bias on cpu, input on cuda:0", Error);
  CHECK_THROWS_WITH_AS(ops::matmul_gelu_backward(ops::zeros({2, 3}, {.device = kCuda}), w2, ops::zeros({2, 8})),
                       "matmul_gelu_backward: pre must be f32 [2, 8] on cuda:0 (the product's), got f32 [2, 8] on cpu",
                       Error);
  CHECK_THROWS_WITH_AS(ops::matmul_gelu_backward(ops::zeros({2, 3}, {.device = kCuda}), w2,
                                                 ops::zeros({2, 8}, {.dtype = DType::bf16, .device = kCuda})),
                       "matmul_gelu_backward: pre must be f32 [2, 8] on cuda:0 (the product's), got bf16 [2, 8] on "
                       "cuda:0",
                       Error);
  CHECK_THROWS_WITH_AS(ops::linear_weight_backward(ops::zeros({2, 3}, {.device = kCuda}), ops::zeros({2, 4}), true),
                       "linear_weight_backward: operands on different devices: cuda:0 and cpu", Error);
  CHECK_THROWS_WITH_AS(linear_gelu_linear(x, w1, Tensor(), ops::zeros({3, 8}), Tensor()),
                       "linear: operands on different devices: cuda:0 and cpu", Error);
}
