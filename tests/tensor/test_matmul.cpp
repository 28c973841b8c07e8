// matmul and linear against a naive f64 triple loop written here: 1-d, 2-d,
// batched, broadcast and strided (transposed, sliced, expanded) operands,
// plus shape inference on meta and the error messages.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tensor/gemm_backend.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace tessera;

namespace {

Tensor random_matrix(const Shape& shape, DType dtype = DType::f32, uint32_t seed = 1) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (double& value : values) value = uniform(generator);
  return ops::from_vector(values, shape, {.dtype = dtype});
}

// Index of each batch element of `shape` (all but the last two dims) in a
// tensor of `batch_shape` broadcast to it (size-1 dims repeat).
int64_t broadcast_batch(const Shape& out_batch, const Shape& batch_shape, int64_t flat) {
  int64_t index = 0, stride = 1;
  const auto lead = static_cast<int64_t>(out_batch.size() - batch_shape.size());
  for (auto d = static_cast<int64_t>(out_batch.size()) - 1; d >= 0; --d) {
    const int64_t coordinate = flat % out_batch[d];
    flat /= out_batch[d];
    if (d < lead) continue;
    const int64_t size = batch_shape[d - lead];
    index += (size == 1 ? 0 : coordinate) * stride;
    stride *= size;
  }
  return index;
}

// A product computed in f64 on the logical values of a and b, with what its
// rounding error in a lower precision is bounded by.
struct ReferenceProduct {
  Shape shape;
  std::vector<double> values;
  // sum over p of |a_ip| |b_pj| per output element: a dot product of k terms
  // evaluated in any order, with or without FMA, is within k u of this of the
  // exact value (u = 2^-24 in f32, 2^-53 in f64; Higham, Accuracy and
  // Stability of Numerical Algorithms, 3.1). So the bound holds for every GEMM
  // blocking, thread count and instruction set, where a relative tolerance
  // would not (cancellation).
  std::vector<double> magnitudes;
  int64_t inner = 0;  // k
};

// Naive torch.matmul in f64.
ReferenceProduct reference_matmul(const Tensor& a, const Tensor& b) {
  Shape as = a.sizes(), bs = b.sizes();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const Shape batch = ops::broadcast_shapes(a_batch, b_batch, "reference");
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const int64_t batches = shape_numel(batch);
  ReferenceProduct product;
  product.inner = k;
  product.values.assign(static_cast<size_t>(batches * m * n), 0.0);
  product.magnitudes.assign(product.values.size(), 0.0);
  for (int64_t batch_index = 0; batch_index < batches; ++batch_index) {
    const int64_t ai = broadcast_batch(batch, a_batch, batch_index) * m * k;
    const int64_t bi = broadcast_batch(batch, b_batch, batch_index) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          sum += av[ai + i * k + p] * bv[bi + p * n + j];
          magnitude += std::abs(av[ai + i * k + p] * bv[bi + p * n + j]);
        }
        product.values[(batch_index * m + i) * n + j] = sum;
        product.magnitudes[(batch_index * m + i) * n + j] = magnitude;
      }
    }
  }
  product.shape = batch;
  if (a.dim() > 1) product.shape.push_back(m);
  if (b.dim() > 1) product.shape.push_back(n);
  return product;
}

double unit_roundoff(DType dtype) { return dtype == DType::f64 ? 0x1p-53 : 0x1p-24; }

// got[i] within `terms` roundings of the reference's magnitude (twice the
// bound: the f64 reference rounds too, which matters when got is f64).
void check_within_rounding(const std::vector<double>& got, const ReferenceProduct& expected, DType dtype,
                           int64_t terms) {
  REQUIRE(got.size() == expected.values.size());
  const double allowance = 2.0 * static_cast<double>(terms) * unit_roundoff(dtype);
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << expected.values[i]);
    CHECK(std::abs(got[i] - expected.values[i]) <= allowance * expected.magnitudes[i]);
  }
}

void check_matmul(const Tensor& a, const Tensor& b) {
  const ReferenceProduct expected = reference_matmul(a, b);
  const Tensor out = ops::matmul(a, b);
  REQUIRE(out.sizes() == expected.shape);
  CHECK(out.dtype() == a.dtype());
  CHECK(out.is_contiguous());
  check_within_rounding(out.to_vector<double>(), expected, a.dtype(), expected.inner);
}

}  // namespace

TEST_CASE("matmul: 2-d products match the naive loop in f32 and f64") {
  check_matmul(random_matrix({5, 7}), random_matrix({7, 3}, DType::f32, 2));
  check_matmul(random_matrix({5, 7}, DType::f64), random_matrix({7, 3}, DType::f64, 2));
  check_matmul(random_matrix({1, 9}), random_matrix({9, 1}, DType::f32, 3));
  // Large enough for Eigen to block and (with threads) split the GEMM.
  check_matmul(random_matrix({130, 257}), random_matrix({257, 140}, DType::f32, 4));
}

TEST_CASE("matmul: 1-d operands are promoted and the added dim dropped") {
  const Tensor dot = ops::matmul(ops::from_vector(std::vector<double>{1, 2, 3}, {3}),
                                 ops::from_vector(std::vector<double>{4, 5, 6}, {3}));
  CHECK(dot.dim() == 0);
  CHECK(dot.item() == 32.0);  // exact in f64
  check_matmul(random_matrix({4}), random_matrix({4, 6}, DType::f32, 2));     // [4] x [4, 6] -> [6]
  check_matmul(random_matrix({5, 4}), random_matrix({4}, DType::f32, 2));     // [5, 4] x [4] -> [5]
  check_matmul(random_matrix({4}), random_matrix({3, 4, 6}, DType::f32, 2));  // -> [3, 6]
  check_matmul(random_matrix({3, 5, 4}), random_matrix({4}, DType::f32, 2));  // -> [3, 5]
}

TEST_CASE("matmul: batched and broadcast batch dims") {
  check_matmul(random_matrix({2, 3, 4, 5}), random_matrix({2, 3, 5, 6}, DType::f32, 2));
  check_matmul(random_matrix({2, 1, 4, 5}), random_matrix({3, 5, 6}, DType::f32, 2));  // -> [2, 3, 4, 6]
  check_matmul(random_matrix({4, 5}), random_matrix({3, 5, 6}, DType::f32, 2));        // a shared by all batches
  check_matmul(random_matrix({2, 4, 5}), random_matrix({5, 3}, DType::f32, 2));        // folds into one GEMM
  // Many small GEMMs: split over batches across threads.
  check_matmul(random_matrix({64, 16, 16}), random_matrix({64, 16, 16}, DType::f32, 2));
}

TEST_CASE("matmul: transposed, sliced and expanded views give the same values") {
  const Tensor a_t = ops::transpose(random_matrix({7, 5}), 0, 1);  // [5, 7], column-major
  const Tensor b_t = ops::transpose(random_matrix({3, 7}, DType::f32, 2), 0, 1);  // [7, 3], column-major
  check_matmul(a_t, random_matrix({7, 3}, DType::f32, 3));
  check_matmul(random_matrix({5, 7}, DType::f32, 3), b_t);
  check_matmul(a_t, b_t);
  // Batched transposes (dW = dY^T X style): [B, N, K]^T.
  check_matmul(ops::transpose(random_matrix({2, 6, 4}), 1, 2), random_matrix({2, 6, 3}, DType::f32, 2));
  check_matmul(random_matrix({2, 4, 6}), ops::transpose(random_matrix({2, 3, 6}, DType::f32, 2), 1, 2));
  // No unit stride in the last two dims: packed before the GEMM.
  const Tensor every_other = ops::slice(random_matrix({5, 14}), 1, 0, 14, 2);  // [5, 7] strides [14, 2]
  check_matmul(every_other, random_matrix({7, 3}, DType::f32, 2));
  check_matmul(random_matrix({3, 7}, DType::f32, 2), ops::transpose(every_other, 0, 1));
  // Stride 0 inside the matrix (a repeated row).
  check_matmul(random_matrix({4, 6}), ops::expand(random_matrix({1, 3}, DType::f32, 2), {6, 3}));
  // A batch that cannot fold into rows (every other batch of x).
  check_matmul(ops::slice(random_matrix({4, 3, 5}), 0, 0, 4, 2), random_matrix({5, 2}, DType::f32, 2));
}

TEST_CASE("matmul: transposed operands are not copied") {
  const Tensor a = ops::transpose(random_matrix({64, 32}), 0, 1);  // [32, 64]
  const Tensor b = ops::transpose(random_matrix({16, 64}, DType::f32, 2), 0, 1);  // [64, 16]
  const int64_t before = memory_stats(kCPU).allocation_count;
  const Tensor out = ops::matmul(a, b);
  CHECK(memory_stats(kCPU).allocation_count - before == 1);  // the output only
  check_matmul(a, b);
}

TEST_CASE("matmul: empty dims") {
  const Tensor zero_inner = ops::matmul(ops::zeros({3, 0}), ops::zeros({0, 4}));
  CHECK(zero_inner.sizes() == Shape{3, 4});
  for (float value : zero_inner.to_vector<float>()) CHECK(value == 0.0f);
  CHECK(ops::matmul(ops::zeros({0, 5}), ops::zeros({5, 4})).sizes() == Shape{0, 4});
  CHECK(ops::matmul(ops::zeros({2, 0, 3, 5}), ops::zeros({5, 4})).sizes() == Shape{2, 0, 3, 4});
}

TEST_CASE("matmul: bf16 and f16 compute in f32 and round once") {
  // The widened operands run through the f32 GEMM: the result is that GEMM's
  // output rounded once, bit for bit.
  const auto rounded = [](const Tensor& f32_result, DType dtype) {
    return ops::to(f32_result, dtype).to_vector<float>();
  };
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Tensor a = random_matrix({6, 32}, dtype), b = random_matrix({32, 5}, dtype, 2);
    const Tensor out = ops::matmul(a, b);
    CHECK(out.dtype() == dtype);
    CHECK(out.to_vector<float>() == rounded(ops::matmul(ops::to(a, DType::f32), ops::to(b, DType::f32)), dtype));
    // linear: x [2, 3, 32] (a batch over one weight), bias added before the single rounding.
    const Tensor x = random_matrix({2, 3, 32}, dtype, 3), bias = random_matrix({5}, dtype, 4);
    const Tensor weight = ops::transpose(b, 0, 1);  // [5, 32]
    const Tensor y = ops::linear(x, weight, bias);
    CHECK(y.dtype() == dtype);
    const Tensor y_f32 = ops::linear(ops::to(x, DType::f32), ops::to(weight, DType::f32), ops::to(bias, DType::f32));
    CHECK(y.to_vector<float>() == rounded(y_f32, dtype));
  }
}

TEST_CASE("matmul: meta tensors infer shapes only") {
  const Tensor a = ops::empty({2, 3, 4, 5}, {.device = kMeta});
  const Tensor b = ops::empty({5, 6}, {.device = kMeta});
  const Tensor out = ops::matmul(a, b);
  CHECK(out.is_meta());
  CHECK(out.sizes() == Shape{2, 3, 4, 6});
  CHECK(ops::matmul(ops::empty({5}, {.device = kMeta}), b).sizes() == Shape{6});
  CHECK_THROWS_WITH_AS(ops::matmul(a, ops::empty({4, 6}, {.device = kMeta})),
                       "matmul: inner dims differ: [2, 3, 4, 5] x [4, 6]", Error);
}

TEST_CASE("matmul: bad operands throw naming the shapes") {
  CHECK_THROWS_WITH_AS(ops::matmul(ops::zeros({4, 8}), ops::zeros({7, 3})), "matmul: inner dims differ: [4, 8] x [7, 3]",
                       Error);
  CHECK_THROWS_WITH_AS(ops::matmul(ops::zeros({4}), ops::zeros({5})), "matmul: inner dims differ: [4] x [5]", Error);
  CHECK_THROWS_WITH_AS(ops::matmul(ops::zeros({2, 3}), ops::zeros({3, 2}, {.dtype = DType::f64})),
                       "matmul: dtype mismatch: f32 [2, 3] x f64 [3, 2]", Error);
  CHECK_THROWS_WITH_AS(ops::matmul(ops::scalar_tensor(2.0), ops::zeros({3})),
                       "matmul: both operands need at least 1 dim, got [] x [3]", Error);
  CHECK_THROWS_AS(ops::matmul(ops::zeros({2, 2, 3}), ops::zeros({3, 3, 2})), Error);  // batch 2 vs 3
  CHECK_THROWS_AS(ops::matmul(ops::zeros({2, 3}), ops::empty({3, 2}, {.device = kMeta})), Error);
  CHECK_THROWS_AS(ops::matmul(ops::zeros({2, 3}, {.dtype = DType::i64}), ops::zeros({3, 2}, {.dtype = DType::i64})),
                  Error);
}

TEST_CASE("linear: x @ weight^T + bias over any leading dims") {
  const Tensor x = random_matrix({2, 3, 4});
  const Tensor weight = random_matrix({5, 4}, DType::f32, 2);
  const Tensor bias = random_matrix({5}, DType::f32, 3);
  const ReferenceProduct product = reference_matmul(x, ops::transpose(weight, 0, 1));
  ReferenceProduct with_bias_expected = product;  // k + 1 terms: the bias is one more
  const std::vector<double> bias_values = bias.to_vector<double>();
  for (size_t i = 0; i < product.values.size(); ++i) {
    with_bias_expected.values[i] += bias_values[i % 5];
    with_bias_expected.magnitudes[i] += std::abs(bias_values[i % 5]);
  }

  const Tensor with_bias = ops::linear(x, weight, bias);
  CHECK(with_bias.sizes() == Shape{2, 3, 5});
  check_within_rounding(with_bias.to_vector<double>(), with_bias_expected, DType::f32, product.inner + 1);
  check_within_rounding(ops::linear(x, weight, Tensor()).to_vector<double>(), product, DType::f32, product.inner);

  const Tensor row = ops::linear(random_matrix({4}), weight, bias);  // 1-d input
  CHECK(row.sizes() == Shape{5});
  // A non-contiguous input (a transposed [B, T] pair).
  const Tensor x_t = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);
  check_within_rounding(ops::linear(x_t, weight, bias).to_vector<double>(), with_bias_expected, DType::f32,
                        product.inner + 1);
}

TEST_CASE("linear: the weight is used as a transposed view, not copied") {
  const Tensor x = random_matrix({8, 16, 32});
  const Tensor weight = random_matrix({24, 32}, DType::f32, 2);
  const int64_t before = memory_stats(kCPU).allocation_count;
  const Tensor out = ops::linear(x, weight, Tensor());
  CHECK(memory_stats(kCPU).allocation_count - before == 1);
  const ReferenceProduct expected = reference_matmul(x, ops::transpose(weight, 0, 1));
  check_within_rounding(out.to_vector<double>(), expected, DType::f32, expected.inner);
}

TEST_CASE("linear: meta shapes and errors") {
  const Tensor out = ops::linear(ops::empty({4, 7, 16}, {.device = kMeta}), ops::empty({32, 16}, {.device = kMeta}),
                                 ops::empty({32}, {.device = kMeta}));
  CHECK(out.is_meta());
  CHECK(out.sizes() == Shape{4, 7, 32});
  CHECK_THROWS_WITH_AS(ops::linear(ops::zeros({2, 5}), ops::zeros({3, 4}), Tensor()),
                       "linear: input [2, 5] has 5 features, weight [3, 4] expects 4", Error);
  CHECK_THROWS_WITH_AS(ops::linear(ops::zeros({2, 4}), ops::zeros({3, 4}), ops::zeros({4})),
                       "linear: bias must be [3], got [4]", Error);
  CHECK_THROWS_AS(ops::linear(ops::zeros({2, 4}), ops::zeros({4}), Tensor()), Error);
  CHECK_THROWS_AS(ops::linear(ops::zeros({2, 4}), ops::zeros({3, 4}, {.dtype = DType::f64}), Tensor()), Error);
}

TEST_CASE("linear_gelu, matmul_gelu_backward, linear_weight_backward: on cpu the composition they document") {
  const auto same_bits = [](const Tensor& got, const Tensor& want) {
    REQUIRE(got.defined());
    REQUIRE(got.sizes() == want.sizes());
    REQUIRE(got.dtype() == want.dtype());
    CHECK(ops::to(got, DType::f64).to_vector<double>() == ops::to(want, DType::f64).to_vector<double>());
  };
  for (const DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = random_matrix({2, 3, 8}, dtype, 11), w = random_matrix({16, 8}, dtype, 12);
    const Tensor b = random_matrix({16}, dtype, 13), g = random_matrix({2, 3, 16}, dtype, 14);
    const ops::LinearGeluOutput fused = ops::linear_gelu(x, w, b);
    const Tensor pre = ops::linear(x, w, b);
    same_bits(fused.pre, pre);
    same_bits(fused.y, ops::gelu(pre, GeluApproximation::tanh));
    same_bits(ops::linear_gelu(x, w, Tensor()).pre, ops::linear(x, w, Tensor()));
    // proj's weight [8, 16]: g [.., 8] @ it -> [.., 16], through gelu at pre.
    const Tensor proj = random_matrix({8, 16}, dtype, 15), g_out = random_matrix({2, 3, 8}, dtype, 16);
    same_bits(ops::matmul_gelu_backward(g_out, proj, pre),
              ops::gelu_backward(ops::matmul(g_out, proj), pre, GeluApproximation::tanh));
    const ops::LinearWeightGrads grads = ops::linear_weight_backward(g, x, true);
    const Tensor g_rows = ops::reshape(g, {6, 16});
    same_bits(grads.weight, ops::matmul(ops::transpose(g_rows, 0, 1), ops::reshape(x, {6, 8})));
    same_bits(grads.bias, ops::sum(g_rows, {0}));
    CHECK_FALSE(ops::linear_weight_backward(g, x, false).bias.defined());
  }
  // A 1-d input is one row.
  const Tensor x1 = random_matrix({8}, DType::f32, 17), w1 = random_matrix({16, 8}, DType::f32, 18);
  CHECK(ops::linear_gelu(x1, w1, Tensor()).y.sizes() == Shape{16});
  CHECK(ops::linear_weight_backward(random_matrix({16}), x1, true).weight.sizes() == Shape{16, 8});
}

TEST_CASE("linear_gelu, matmul_gelu_backward, linear_weight_backward: meta shapes and errors") {
  const Tensor on_meta = ops::empty({4, 7, 16}, {.device = kMeta});
  const ops::LinearGeluOutput meta =
      ops::linear_gelu(on_meta, ops::empty({32, 16}, {.device = kMeta}), ops::empty({32}, {.device = kMeta}));
  CHECK((meta.y.is_meta() && meta.pre.is_meta()));
  CHECK((meta.y.sizes() == Shape{4, 7, 32} && meta.pre.sizes() == Shape{4, 7, 32}));
  CHECK(ops::matmul_gelu_backward(on_meta, ops::empty({16, 32}, {.device = kMeta}),
                                  ops::empty({4, 7, 32}, {.device = kMeta}))
            .sizes() == Shape{4, 7, 32});
  const ops::LinearWeightGrads meta_grads =
      ops::linear_weight_backward(ops::empty({4, 7, 32}, {.device = kMeta}), on_meta, true);
  CHECK((meta_grads.weight.sizes() == Shape{32, 16} && meta_grads.bias.sizes() == Shape{32}));

  CHECK_THROWS_WITH_AS(ops::linear_gelu(ops::zeros({2, 5}), ops::zeros({3, 4}), Tensor()),
                       "linear_gelu: input [2, 5] has 5 features, weight [3, 4] expects 4", Error);
  CHECK_THROWS_WITH_AS(ops::linear_gelu(ops::zeros({2, 4}), ops::zeros({3, 4}), ops::zeros({4})),
                       "linear_gelu: bias must be [3], got [4]", Error);
  CHECK_THROWS_WITH_AS(ops::linear_gelu(ops::zeros({2, 4}), ops::zeros({3, 4}, {.dtype = DType::f64}), Tensor()),
                       "linear_gelu: dtype mismatch: f32 [2, 4] x f64 [3, 4]", Error);
  CHECK_THROWS_WITH_AS(ops::linear_gelu(ops::zeros({2, 4}, {.dtype = DType::i64}),
                                        ops::zeros({3, 4}, {.dtype = DType::i64}), Tensor()),
                       "linear_gelu: needs floating tensors, got i64", Error);
  CHECK_THROWS_WITH_AS(ops::matmul_gelu_backward(ops::zeros({2, 4}), ops::zeros({5, 3}), ops::zeros({2, 3})),
                       "matmul_gelu_backward: inner dims differ: [2, 4] x [5, 3]", Error);
  CHECK_THROWS_WITH_AS(ops::matmul_gelu_backward(ops::zeros({2, 4}), ops::zeros({2, 4, 3}), ops::zeros({2, 3})),
                       "matmul_gelu_backward: a must be [..., M, K] and b [K, N], got [2, 4] x [2, 4, 3]", Error);
  CHECK_THROWS_WITH_AS(ops::matmul_gelu_backward(ops::zeros({2, 4}), ops::zeros({4, 3}), ops::zeros({3, 2})),
                       "matmul_gelu_backward: pre must be f32 [2, 3] on cpu (the product's), got f32 [3, 2] on cpu",
                       Error);
  CHECK_THROWS_WITH_AS(ops::linear_weight_backward(ops::zeros({2, 3, 4}), ops::zeros({3, 2, 5}), true),
                       "linear_weight_backward: grad_y [..., out] and x [..., in] must share their leading dims, got "
                       "[2, 3, 4] and [3, 2, 5]",
                       Error);
}

TEST_CASE("matmul: the same values on 1 and 2 threads") {
  const int threads = num_threads();
  const Tensor a = random_matrix({96, 200}), b = random_matrix({200, 300}, DType::f32, 2);
  const Tensor batched_a = random_matrix({32, 8, 8}), batched_b = random_matrix({32, 8, 8}, DType::f32, 2);
  set_num_threads(1);
  const std::vector<float> one = ops::matmul(a, b).to_vector<float>();
  const std::vector<float> batched_one = ops::matmul(batched_a, batched_b).to_vector<float>();
  set_num_threads(2);
  const std::vector<float> two = ops::matmul(a, b).to_vector<float>();
  const std::vector<float> batched_two = ops::matmul(batched_a, batched_b).to_vector<float>();
  set_num_threads(threads);
  // Eigen's blocking depends on the thread count, so the summation order may
  // differ: both within rounding of the exact product. Batched small GEMMs
  // are split by batch: bitwise equal.
  const ReferenceProduct expected = reference_matmul(a, b);
  check_within_rounding(std::vector<double>(one.begin(), one.end()), expected, DType::f32, expected.inner);
  check_within_rounding(std::vector<double>(two.begin(), two.end()), expected, DType::f32, expected.inner);
  CHECK(batched_one == batched_two);
}

namespace {

// Selects a GEMM backend for its lifetime.
struct GemmBackendScope {
  GemmBackend previous = gemm_backend();
  explicit GemmBackendScope(GemmBackend backend) { set_gemm_backend(backend); }
  ~GemmBackendScope() { set_gemm_backend(previous); }
};

}  // namespace

TEST_CASE("matmul: every GEMM backend built in is within rounding on every layout, and reproducible") {
  const Tensor a = random_matrix({37, 53}), b = random_matrix({53, 29}, DType::f32, 2);
  const Tensor at = ops::transpose(random_matrix({53, 37}, DType::f32, 3), 0, 1);  // column-major [37, 53]
  const Tensor bt = ops::transpose(random_matrix({29, 53}, DType::f32, 4), 0, 1);  // column-major [53, 29]
  const Tensor strided = ops::narrow(random_matrix({37, 106}, DType::f32, 5), 1, 0, 53);  // rows 106 apart
  const Tensor every_other = ops::slice(random_matrix({37, 106}, DType::f32, 6), 1, 0, 106, 2);  // packed
  const Tensor batched = random_matrix({3, 5, 37, 53}, DType::f32, 7), shared = random_matrix({53, 29}, DType::f32, 8);
  const Tensor a64 = random_matrix({37, 53}, DType::f64, 9), b64 = random_matrix({53, 29}, DType::f64, 10);
  const std::vector<std::pair<Tensor, Tensor>> products = {
      {a, b}, {a, bt}, {at, b}, {at, bt}, {strided, b}, {every_other, bt}, {batched, shared}, {a64, b64}};
  for (const GemmBackend backend : {GemmBackend::eigen, GemmBackend::blas}) {
    CAPTURE(gemm_backend_name(backend));
    if (!gemm_backend_built(backend)) {
      CHECK_THROWS_WITH_AS(set_gemm_backend(backend), doctest::Contains("this build has no blas backend"), Error);
      continue;
    }
    const GemmBackendScope scope(backend);
    CHECK(gemm_backend() == backend);
    for (size_t index = 0; index < products.size(); ++index) {
      CAPTURE(index);
      const auto& [lhs, rhs] = products[index];
      check_matmul(lhs, rhs);
      CHECK(ops::matmul(lhs, rhs).to_vector<double>() == ops::matmul(lhs, rhs).to_vector<double>());
    }
  }
}

TEST_CASE("matmul: GEMM backends by name, as TESSERA_GEMM names them") {
  CHECK(gemm_backend_named("eigen") == GemmBackend::eigen);
  CHECK_THROWS_WITH_AS(gemm_backend_named("mkl"), doctest::Contains("unknown GEMM backend 'mkl': expected eigen or blas"),
                       Error);
  if (gemm_backend_built(GemmBackend::blas)) {
    CHECK(gemm_backend_named("blas") == GemmBackend::blas);
    const GemmBackendScope scope(GemmBackend::blas);
    CHECK(gemm_description().find("OpenBLAS") == 0);
  } else {
    CHECK_THROWS_WITH_AS(gemm_backend_named("blas"), doctest::Contains("not in this build"), Error);
  }
  const GemmBackendScope scope(GemmBackend::eigen);
  CHECK(gemm_description().find("Eigen 3.") == 0);
}
