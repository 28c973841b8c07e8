// Reductions against naive double-precision loops: every dim set and layout
// (rows, columns, middle dims, transposed, expanded, sliced), accuracy of
// long f32 sums, integer and bool sums, NaN handling, max with indices,
// sum_to_shape as the inverse of broadcasting, meta shapes and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace tessera;
namespace ops = tessera::ops;

namespace {

Tensor varied_tensor(const Shape& shape, DType dtype = DType::f32, double seed = 0.0) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<double>(i) * 0.37 + seed) * (1 + i % 5);
  return ops::from_vector(values, shape, {.dtype = dtype});
}

enum class Kind { sum, max, min };

// Naive reduction of x over `dims` (keepdim shape, row-major), in double.
std::vector<double> reference(const Tensor& x, const std::vector<int64_t>& dims, Kind kind) {
  const auto values = x.to_vector<double>();
  const Shape& shape = x.sizes();
  std::vector<bool> reduced(shape.size(), dims.empty());
  for (int64_t d : dims) reduced[d < 0 ? d + static_cast<int64_t>(shape.size()) : d] = true;
  Shape keep = shape;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) keep[d] = 1;
  }
  const double init = kind == Kind::sum ? 0.0
                      : kind == Kind::max ? -std::numeric_limits<double>::infinity()
                                          : std::numeric_limits<double>::infinity();
  std::vector<double> out(static_cast<size_t>(shape_numel(keep)), init);
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    int64_t rest = i, index = 0, stride = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t coordinate = rest % shape[d];
      rest /= shape[d];
      if (!reduced[d]) index += coordinate * stride;
      stride *= keep[d];
    }
    double& slot = out[index];
    slot = kind == Kind::sum ? slot + values[i] : kind == Kind::max ? std::max(slot, values[i]) : std::min(slot, values[i]);
  }
  return out;
}

void check_equal(const Tensor& result, const std::vector<double>& expected) {
  CHECK(result.to_vector<double>() == expected);
}

// sum(x, dims) against the exact sum: the kernel accumulates f32 and f64 in
// f64, which is within n 2^-53 sum|x| of the exact value in any order (n
// terms per output; Higham 4.2), and an f32 result rounds once more, within
// an f32 ulp. A bound for every order of summation, layout and machine.
void check_sum(const Tensor& result, const Tensor& x, const std::vector<int64_t>& dims) {
  const std::vector<double> values = result.to_vector<double>(), exact = reference(x, dims, Kind::sum);
  const std::vector<double> magnitudes = reference(ops::abs(x), dims, Kind::sum);
  REQUIRE(values.size() == exact.size());
  const double terms = static_cast<double>(x.numel()) / static_cast<double>(std::max<int64_t>(result.numel(), 1));
  for (size_t i = 0; i < values.size(); ++i) {
    const bool rounds = result.dtype() == DType::f32 && exact[i] != 0.0;  // an f32 ulp at exact
    const double rounding = rounds ? std::ldexp(1.0, std::ilogb(exact[i]) - 23) : 0.0;
    INFO("output " << i << ": " << values[i] << " vs " << exact[i]);
    CHECK(std::abs(values[i] - exact[i]) <= terms * 0x1p-53 * magnitudes[i] + rounding);
  }
}

// Every reduction of x over dims, against the reference.
void check_all(const Tensor& x, const std::vector<int64_t>& dims) {
  const std::string geometry = fmt::format("shape {} strides {} dims {}", x.sizes(), x.strides(), dims);
  CAPTURE(geometry);
  check_sum(ops::sum(x, dims, true), x, dims);
  check_equal(ops::amax(x, dims, true), reference(x, dims, Kind::max));
  check_equal(ops::amin(x, dims, true), reference(x, dims, Kind::min));
}

}  // namespace

TEST_CASE("sum, amax, amin over every dim set of a 3-d tensor") {
  const Tensor x = varied_tensor({5, 6, 7});
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {-1}, {0, 1}, {0, 2}, {1, 2}, {2, 0}, {0, 1, 2}};
  for (const auto& dims : dim_sets) check_all(x, dims);
}

TEST_CASE("reduction layouts: long rows, column sums, middle dims, strided and expanded inputs") {
  check_all(varied_tensor({3, 20000}), {1});           // rows split into blocks
  check_all(varied_tensor({50000}), {});               // one long row over both threads
  check_all(varied_tensor({300, 768}), {0});           // bias grads: [N, C] -> [C]
  check_all(varied_tensor({4, 9, 2000}), {0, 1});      // wide columns
  check_all(varied_tensor({4, 300, 5}), {1});          // [A, R, C] middle dim
  check_all(varied_tensor({2, 3, 4, 5}), {0, 2});      // alternating dims
  check_all(varied_tensor({2, 3, 4, 5}), {1, 3});
  const Tensor transposed = ops::transpose(varied_tensor({40, 30}), 0, 1);  // [30, 40], strides [1, 30]
  check_all(transposed, {0});
  check_all(transposed, {1});
  check_all(transposed, {});
  const Tensor expanded = ops::expand(varied_tensor({1, 16}), {50, 16});  // zero stride
  check_all(expanded, {0});
  check_all(expanded, {1});
  const Tensor sliced = ops::slice(varied_tensor({10, 64}), 1, 1, 64, 3);
  check_all(sliced, {1});
  check_all(sliced, {0});
  check_all(ops::permute(varied_tensor({3, 4, 5}), {2, 0, 1}), {0, 2});
}

TEST_CASE("keepdim, negative dims and 0-d tensors") {
  const Tensor x = varied_tensor({2, 3, 4});
  CHECK(ops::sum(x, {1}).sizes() == Shape{2, 4});
  CHECK(ops::sum(x, {1}, true).sizes() == Shape{2, 1, 4});
  CHECK(ops::sum(x, {-1, 0}).sizes() == Shape{3});
  CHECK(ops::sum(x).sizes() == Shape{});
  CHECK(ops::sum(x, {}, true).sizes() == Shape{1, 1, 1});
  CHECK(ops::mean(x, {0, 2}, true).sizes() == Shape{1, 3, 1});
  const Tensor scalar = ops::scalar_tensor(2.5);
  CHECK(ops::sum(scalar).item() == 2.5);
  CHECK(ops::sum(scalar, {0}).item() == 2.5);
  CHECK(ops::amax(scalar, {-1}).item() == 2.5);
  const auto [value, index] = ops::max(scalar, 0);
  CHECK(value.item() == 2.5);
  CHECK(index.item() == 0);
}

TEST_CASE("long f32 sums stay accurate") {
  const int64_t n = 1 << 20;
  const Tensor tenths = ops::full({n}, 0.1);
  // The exact sum of n copies of 0.1f, rounded once.
  const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
  CHECK(ops::sum(tenths).item() == static_cast<double>(static_cast<float>(exact)));
  CHECK(ops::mean(tenths).item() == static_cast<double>(0.1f));
  check_sum(ops::sum(ops::randn({n}, PhiloxKey{7, 7})), ops::randn({n}, PhiloxKey{7, 7}), {});
}

TEST_CASE("sum and mean dtypes: integers and bools sum to i64, 16-bit floats stay 16-bit") {
  const Tensor big = ops::full({4}, 2000000000.0, {.dtype = DType::i32});
  CHECK(ops::sum(big).dtype() == DType::i64);
  CHECK(ops::sum(big).item<int64_t>() == 8000000000LL);
  const Tensor flags = ops::from_vector(std::vector<int64_t>{1, 0, 1, 1}, {4}, {.dtype = DType::boolean});
  CHECK(ops::sum(flags).dtype() == DType::i64);
  CHECK(ops::sum(flags).item() == 3.0);
  CHECK(ops::mean(flags).dtype() == DType::f32);
  CHECK(ops::mean(flags).item() == 0.75);
  CHECK(ops::amax(flags).item() == 1.0);
  CHECK(ops::amin(flags).dtype() == DType::boolean);
  CHECK(ops::amin(flags).item() == 0.0);
  const Tensor ints = ops::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  CHECK(ops::mean(ints, {1}).to_vector<float>() == std::vector<float>{1.5f, 3.5f});
  CHECK(ops::amax(ints, {0}).dtype() == DType::i64);
  CHECK(ops::amax(ints, {0}).to_vector<int64_t>() == std::vector<int64_t>{3, 4});
  const Tensor h = ops::to(varied_tensor({8, 16}), DType::bf16);
  const Tensor hs = ops::sum(h, {1});
  CHECK(hs.dtype() == DType::bf16);
  CHECK(hs.to_vector<float>() == ops::to(ops::sum(ops::to(h, DType::f32), {1}), DType::bf16).to_vector<float>());
  CHECK(ops::mean(ops::to(h, DType::f16)).dtype() == DType::f16);
  CHECK(ops::sum(varied_tensor({3}, DType::f64)).dtype() == DType::f64);
}

TEST_CASE("empty reductions: sum is 0, mean is NaN, max and min throw") {
  const Tensor empty = ops::zeros({0, 3});
  CHECK(ops::sum(empty).item() == 0.0);
  CHECK(ops::sum(empty, {0}).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(ops::sum(empty, {1}).sizes() == Shape{0});
  CHECK(std::isnan(ops::mean(empty).item()));
  CHECK_THROWS_WITH_AS(ops::amax(empty), doctest::Contains("amax: cannot reduce over an empty dim"), Error);
  CHECK_THROWS_AS(ops::amin(empty, {0}), Error);
  CHECK(ops::amax(empty, {1}).sizes() == Shape{0});
  CHECK_THROWS_WITH_AS(ops::max(empty, 0), doctest::Contains("size 0"), Error);
}

TEST_CASE("amax and amin propagate NaN") {
  const float nan = std::nanf("");
  const Tensor x = ops::from_vector(std::vector<float>{1.f, nan, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  CHECK(std::isnan(ops::amax(x).item()));
  const auto rows = ops::amin(x, {1}).to_vector<float>();
  CHECK(std::isnan(rows[0]));
  CHECK(rows[1] == 4.f);
}

TEST_CASE("max: values and first index along a dim") {
  const Tensor x = ops::from_vector(std::vector<float>{1.f, 5.f, 5.f, -2.f, 0.f, 7.f, 3.f, 7.f}, {2, 4});
  const auto [values, indices] = ops::max(x, 1);
  CHECK(values.to_vector<float>() == std::vector<float>{5.f, 7.f});
  CHECK(indices.dtype() == DType::i64);
  CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{1, 1});  // ties keep the first
  const auto [column_values, column_indices] = ops::max(x, 0, true);
  CHECK(column_values.sizes() == Shape{1, 4});
  CHECK(column_values.to_vector<float>() == std::vector<float>{1.f, 7.f, 5.f, 7.f});
  CHECK(column_indices.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 1});
  CHECK(ops::argmax(x, -1).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  CHECK(ops::argmax(ops::transpose(x, 0, 1), 0).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  // NaN counts as the maximum.
  const Tensor with_nan = ops::from_vector(std::vector<float>{1.f, std::nanf(""), 9.f}, {3});
  CHECK(ops::argmax(with_nan, 0).item() == 1.0);
  // Larger, strided and 16-bit inputs against the reference.
  const Tensor big = varied_tensor({37, 129});
  const auto expected = reference(big, {1}, Kind::max);
  CHECK(ops::max(big, 1).first.to_vector<double>() == expected);
  CHECK(ops::max(ops::transpose(ops::contiguous(ops::transpose(big, 0, 1)), 0, 1), 1).first.to_vector<double>() ==
        expected);
  const auto [hv, hi] = ops::max(ops::to(x, DType::bf16), 1);
  CHECK(hv.dtype() == DType::bf16);
  CHECK(hi.to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  const Tensor ints = ops::from_vector(std::vector<int64_t>{3, 9, 9, 1}, {4}, {.dtype = DType::i32});
  CHECK(ops::argmax(ints, 0).item() == 1.0);
}

TEST_CASE("sum_to_shape undoes broadcasting") {
  const Tensor grad = varied_tensor({4, 3, 5});
  CHECK(ops::sum_to_shape(grad, {4, 3, 5}).is_same(grad));
  const Tensor bias_grad = ops::sum_to_shape(grad, {5});
  CHECK(bias_grad.sizes() == Shape{5});
  check_sum(bias_grad, grad, {0, 1});
  const Tensor row_grad = ops::sum_to_shape(grad, {3, 1});
  CHECK(row_grad.sizes() == Shape{3, 1});
  check_sum(row_grad, grad, {0, 2});
  CHECK(ops::sum_to_shape(grad, {1, 3, 1}).sizes() == Shape{1, 3, 1});
  check_sum(ops::sum_to_shape(grad, {}), grad, {});
  // Each element of a broadcast operand is counted once per position it was copied to.
  const Tensor counted = ops::sum_to_shape(ops::ones({2, 6, 4}), {6, 1});
  CHECK(counted.to_vector<float>() == std::vector<float>(6, 8.0f));
  CHECK(ops::sum_to_shape(ops::empty({8, 3, 5}, {.device = kMeta}), {3, 1}).sizes() == Shape{3, 1});
  CHECK_THROWS_WITH_AS(ops::sum_to_shape(grad, {4, 5}),
                       doctest::Contains("sum_to_shape: shape [4, 5] does not broadcast to the grad's shape [4, 3, 5]"),
                       Error);
  CHECK_THROWS_AS(ops::sum_to_shape(grad, {1, 4, 3, 5}), Error);
}

TEST_CASE("reduction meta shapes and bad dims") {
  const Tensor x = ops::empty({2, 3, 4}, {.dtype = DType::i32, .device = kMeta});
  CHECK(ops::sum(x, {1}).sizes() == Shape{2, 4});
  CHECK(ops::sum(x, {1}).dtype() == DType::i64);
  CHECK(ops::sum(x, {1}).is_meta());
  CHECK(ops::mean(x).dtype() == DType::f32);
  CHECK(ops::amax(x, {0}, true).sizes() == Shape{1, 3, 4});
  const auto [values, indices] = ops::max(x, 2);
  CHECK(values.sizes() == Shape{2, 3});
  CHECK(indices.dtype() == DType::i64);
  const Tensor y = ops::ones({2, 3});
  CHECK_THROWS_WITH_AS(ops::sum(y, {1, -1}), doctest::Contains("sum: dim -1 appears more than once"), Error);
  CHECK_THROWS_WITH_AS(ops::sum(y, {2}), doctest::Contains("out of range"), Error);
  CHECK_THROWS_AS(ops::max(y, -3), Error);
  Tensor undefined;
  CHECK_THROWS_AS(ops::sum(undefined), Error);
}

TEST_CASE("reductions give the same bits on 1 and 2 threads") {
  const Tensor x = ops::randn({512, 768}, PhiloxKey{9, 3});
  const int threads = num_threads();
  set_num_threads(1);
  const double total = ops::sum(x).item();
  const auto columns = ops::sum(x, {0}).to_vector<float>();
  const auto rows = ops::sum(x, {1}).to_vector<float>();
  set_num_threads(2);
  CHECK(ops::sum(x).item() == total);
  CHECK(ops::sum(x, {0}).to_vector<float>() == columns);
  CHECK(ops::sum(x, {1}).to_vector<float>() == rows);
  set_num_threads(threads);
}
