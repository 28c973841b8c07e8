// Views (shared storage, strides, error paths), joining and splitting,
// index_select / index_add_ against naive references, shape inference on
// meta for all of them, and the printer.
#include <doctest/doctest.h>

#include <sstream>

#include "tensor/ops.h"

using namespace tessera;
namespace ops = tessera::ops;

namespace {

// 0, 1, 2, ... in `shape`.
Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  return ops::reshape(ops::arange(0, static_cast<double>(shape_numel(shape)), 1, {.dtype = dtype}), shape);
}

std::vector<float> values(const Tensor& tensor) { return tensor.to_vector<float>(); }

std::vector<float> range(float first, float last) {
  std::vector<float> result;
  for (float value = first; value <= last; value += 1.0f) result.push_back(value);
  return result;
}

}  // namespace

TEST_CASE("view: shares storage, infers -1, refuses incompatible strides") {
  Tensor x = iota({2, 3, 4});
  Tensor v = ops::view(x, {6, 4});
  CHECK(v.sizes() == Shape{6, 4});
  CHECK(v.strides() == Shape{4, 1});
  CHECK(v.shares_storage_with(x));
  CHECK(ops::view(x, {-1}).sizes() == Shape{24});
  CHECK(ops::view(x, {4, -1, 2}).sizes() == Shape{4, 3, 2});
  CHECK(ops::view(ops::view(x, {24}), {2, 3, 4}).strides() == Shape{12, 4, 1});
  CHECK(ops::view(iota({1}), {}).dim() == 0);
  CHECK(ops::view(ops::scalar_tensor(3), {1, 1}).sizes() == Shape{1, 1});
  CHECK(ops::view(ops::empty({0, 3}), {3, 0}).sizes() == Shape{3, 0});

  // Writes through the view land in the base.
  Tensor first = ops::narrow(ops::view(x, {24}), 0, 0, 1);
  ops::fill_(first, 100.0);
  CHECK(values(x)[0] == 100.0f);

  // Merging dims that stay evenly spaced works on a strided tensor.
  Tensor p = ops::permute(iota({2, 3, 4}), {1, 2, 0});  // [3, 4, 2], strides [4, 1, 12]
  Tensor merged = ops::view(p, {12, 2});
  CHECK(merged.strides() == Shape{1, 12});
  CHECK(merged.shares_storage_with(p));
  CHECK(values(merged) == values(ops::reshape(ops::contiguous(p), {12, 2})));
  // Splitting a dim of a strided tensor too.
  Tensor t = ops::transpose(iota({4, 6}), 0, 1);  // [6, 4], strides [1, 6]
  CHECK(ops::view(t, {2, 3, 4}).strides() == Shape{3, 1, 6});

  CHECK_THROWS_WITH_AS(ops::view(t, {24}), doctest::Contains("use reshape"), Error);
  CHECK_THROWS_WITH_AS(ops::view(t, {24}),
                       doctest::Contains("view: shape [24] is not compatible with the strides [1, 6]"), Error);
  CHECK_THROWS_WITH_AS(
      ops::view(x, {5, -1}),
      doctest::Contains("view: shape [5, -1] is invalid for a tensor of 24 elements (shape [2, 3, 4])"), Error);
  CHECK_THROWS_WITH_AS(ops::view(x, {-1, -1}), doctest::Contains("more than one -1"), Error);
  CHECK_THROWS_WITH_AS(ops::view(x, {-2, -12}), doctest::Contains("invalid size -2"), Error);
  CHECK_THROWS_AS(ops::view(x, {5, 5}), Error);
  CHECK_THROWS_AS(ops::view(ops::empty({0}), {-1, 0}), Error);
}

TEST_CASE("reshape views when it can and copies when it must") {
  Tensor x = iota({2, 3, 4});
  Tensor r = ops::reshape(x, {4, 6});
  CHECK(r.shares_storage_with(x));
  Tensor t = ops::transpose(x, 1, 2);  // [2, 4, 3]
  Tensor copied = ops::reshape(t, {2, 12});
  CHECK_FALSE(copied.shares_storage_with(x));
  CHECK(copied.is_contiguous());
  CHECK(values(copied) == values(t));
  CHECK(ops::reshape(t, {2, 4, 3}).shares_storage_with(x));  // same shape: still a view
  CHECK_THROWS_WITH_AS(ops::reshape(x, {7, -1}), doctest::Contains("reshape: shape [7, -1] is invalid"), Error);
}

TEST_CASE("flatten") {
  Tensor x = iota({2, 3, 4, 5});
  CHECK(ops::flatten(x).sizes() == Shape{120});
  CHECK(ops::flatten(x, 1).sizes() == Shape{2, 60});
  CHECK(ops::flatten(x, 1, 2).sizes() == Shape{2, 12, 5});
  CHECK(ops::flatten(x, -2, -1).sizes() == Shape{2, 3, 20});
  CHECK(ops::flatten(x, 2, 2).sizes() == Shape{2, 3, 4, 5});
  CHECK(ops::flatten(ops::scalar_tensor(1)).sizes() == Shape{1});
  CHECK(values(ops::flatten(ops::transpose(iota({2, 2}), 0, 1))) == std::vector<float>{0, 2, 1, 3});
  CHECK_THROWS_WITH_AS(ops::flatten(x, 3, 1), doctest::Contains("flatten: start_dim 3 comes after end_dim 1"), Error);
  CHECK_THROWS_WITH_AS(ops::flatten(x, 4), doctest::Contains("flatten: dim 4 out of range for a 4-d tensor"), Error);
}

TEST_CASE("permute and transpose") {
  Tensor x = iota({2, 3, 4});
  Tensor p = ops::permute(x, {2, 0, 1});
  CHECK(p.sizes() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(p.shares_storage_with(x));
  CHECK(ops::permute(x, {-1, -3, -2}).strides() == p.strides());
  const auto permuted = values(p);
  const auto original = values(x);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t k = 0; k < 3; ++k) CHECK(permuted[(i * 2 + j) * 3 + k] == original[(j * 3 + k) * 4 + i]);
    }
  }
  Tensor t = ops::transpose(x, 0, -1);
  CHECK(t.sizes() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});
  CHECK(ops::transpose(ops::scalar_tensor(2), 0, -1).dim() == 0);
  CHECK_THROWS_WITH_AS(ops::permute(x, {0, 1}), doctest::Contains("permute: dims [0, 1] do not match the 3 dims"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::permute(x, {0, 1, 1}), doctest::Contains("permute: dim 1 repeats in [0, 1, 1]"), Error);
  CHECK_THROWS_AS(ops::permute(x, {0, 1, 3}), Error);
  CHECK_THROWS_AS(ops::transpose(x, 0, 3), Error);
}

TEST_CASE("narrow, slice and select") {
  Tensor x = iota({4, 5});
  Tensor n = ops::narrow(x, 1, 1, 3);
  CHECK(n.sizes() == Shape{4, 3});
  CHECK(n.storage_offset() == 1);
  CHECK(n.shares_storage_with(x));
  CHECK(values(ops::narrow(x, 0, -1, 1)) == range(15, 19));
  CHECK(ops::narrow(x, 0, 4, 0).numel() == 0);
  CHECK_THROWS_WITH_AS(ops::narrow(x, 1, 3, 3), doctest::Contains("narrow: [3, 3 + 3) is out of range for dim 1"),
                       Error);
  CHECK_THROWS_AS(ops::narrow(x, 0, 0, -1), Error);
  CHECK_THROWS_AS(ops::narrow(ops::scalar_tensor(1), 0, 0, 1), Error);

  Tensor row = ops::arange(0, 10);
  CHECK(values(ops::slice(row, 0, 2, 8, 3)) == std::vector<float>{2, 5});
  CHECK(values(ops::slice(row, 0, -3, 100)) == std::vector<float>{7, 8, 9});
  CHECK(values(ops::slice(row, 0, -100, 2)) == std::vector<float>{0, 1});
  CHECK(ops::slice(row, 0, 8, 3).numel() == 0);
  CHECK(ops::slice(row, 0, 10, 20).numel() == 0);
  CHECK(ops::slice(row, 0, 0, 10, 4).strides() == Shape{4});
  CHECK(values(ops::slice(x, 1, 0, 5, 2)) == std::vector<float>{0, 2, 4, 5, 7, 9, 10, 12, 14, 15, 17, 19});
  CHECK_THROWS_WITH_AS(ops::slice(row, 0, 0, 5, 0), doctest::Contains("slice: step must be >= 1, got 0"), Error);
  CHECK_THROWS_AS(ops::slice(row, 0, 0, 5, -1), Error);

  Tensor s = ops::select(x, 1, -1);
  CHECK(s.sizes() == Shape{4});
  CHECK(values(s) == std::vector<float>{4, 9, 14, 19});
  CHECK(ops::select(ops::select(x, 0, 2), 0, 3).item() == 13.0);
  ops::fill_(s, -1.0);  // writes reach the base
  CHECK(values(x)[9] == -1.0f);
  CHECK_THROWS_WITH_AS(ops::select(x, 0, 4),
                       doctest::Contains("select: index 4 is out of range for dim 0 of shape [4, 5]"), Error);
  CHECK_THROWS_AS(ops::select(x, 0, -5), Error);
  CHECK_THROWS_AS(ops::select(ops::scalar_tensor(1), 0, 0), Error);
}

TEST_CASE("squeeze and unsqueeze") {
  Tensor x = iota({1, 3, 1, 2});
  CHECK(ops::squeeze(x).sizes() == Shape{3, 2});
  CHECK(ops::squeeze(x, 2).sizes() == Shape{1, 3, 2});
  CHECK(ops::squeeze(x, 1).sizes() == Shape{1, 3, 1, 2});  // not size 1: unchanged
  CHECK(ops::squeeze(x, -4).sizes() == Shape{3, 1, 2});
  CHECK(ops::squeeze(ops::scalar_tensor(1), 0).dim() == 0);
  CHECK(ops::squeeze(x).shares_storage_with(x));
  Tensor v = iota({2, 3});
  CHECK(ops::unsqueeze(v, 0).sizes() == Shape{1, 2, 3});
  CHECK(ops::unsqueeze(v, 1).sizes() == Shape{2, 1, 3});
  CHECK(ops::unsqueeze(v, -1).sizes() == Shape{2, 3, 1});
  CHECK(ops::unsqueeze(v, 2).is_contiguous());
  CHECK(ops::unsqueeze(ops::scalar_tensor(1), 0).sizes() == Shape{1});
  CHECK(values(ops::unsqueeze(v, 1)) == values(v));
  CHECK_THROWS_WITH_AS(ops::unsqueeze(v, 3), doctest::Contains("unsqueeze: dim 3 out of range"), Error);
  CHECK_THROWS_AS(ops::squeeze(x, 4), Error);
}

TEST_CASE("expand: stride-0 broadcast views") {
  Tensor x = ops::from_vector(std::vector<float>{1, 2, 3}, {3, 1});
  Tensor e = ops::expand(x, {2, 3, 4});
  CHECK(e.sizes() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(e.shares_storage_with(x));
  CHECK(values(ops::select(e, 0, 1)) == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK(ops::expand(x, {-1, 2}).sizes() == Shape{3, 2});
  CHECK(ops::expand(x, {3, 0}).numel() == 0);
  CHECK(ops::expand(ops::scalar_tensor(5), {2, 2}).strides() == Shape{0, 0});
  CHECK_THROWS_WITH_AS(ops::expand(x, {4, 4}),
                       doctest::Contains("expand: dim 0 of size 3 cannot expand to 4 (only size-1 dims expand"), Error);
  CHECK_THROWS_WITH_AS(ops::expand(x, {4}), doctest::Contains("which has fewer dims"), Error);
  CHECK_THROWS_WITH_AS(ops::expand(x, {-1, 3, 4}), doctest::Contains("new leading dim 0 has invalid size -1"), Error);
}

TEST_CASE("as_strided is bounds-checked") {
  Tensor x = iota({6});
  Tensor windows = ops::as_strided(x, {3, 4}, {1, 1}, 0);  // overlapping windows
  CHECK(values(windows) == std::vector<float>{0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5});
  CHECK(windows.shares_storage_with(x));
  CHECK(values(ops::as_strided(x, {2}, {2}, 3)) == std::vector<float>{3, 5});
  CHECK_THROWS_WITH_AS(ops::as_strided(x, {3, 4}, {2, 1}, 0), doctest::Contains("as_strided:"), Error);
  CHECK_THROWS_AS(ops::as_strided(x, {2}, {1}, -1), Error);
  CHECK_THROWS_AS(ops::as_strided(x, {2, 2}, {1}, 0), Error);
  CHECK_THROWS_AS(ops::as_strided(x, {2}, {-1}, 3), Error);
}

TEST_CASE("broadcast_shapes") {
  CHECK(ops::broadcast_shapes({2, 1, 4}, {3, 1}, "add") == Shape{2, 3, 4});
  CHECK(ops::broadcast_shapes({}, {5}, "add") == Shape{5});
  CHECK(ops::broadcast_shapes({0, 1}, {1, 3}, "add") == Shape{0, 3});
  CHECK_THROWS_WITH_AS(ops::broadcast_shapes({2, 3}, {4, 3}, "mul"),
                       doctest::Contains("mul: shapes [2, 3] and [4, 3] do not broadcast"), Error);
}

TEST_CASE("cat") {
  Tensor a = iota({2, 3});
  Tensor b = ops::full({1, 3}, -1.0);
  Tensor c = ops::cat({a, b}, 0);
  CHECK(c.sizes() == Shape{3, 3});
  CHECK(values(c) == std::vector<float>{0, 1, 2, 3, 4, 5, -1, -1, -1});
  Tensor d = ops::cat({a, ops::transpose(iota({2, 2}), 0, 1)}, -1);  // strided input
  CHECK(values(d) == std::vector<float>{0, 1, 2, 0, 2, 3, 4, 5, 1, 3});
  CHECK(values(ops::cat({a}, 1)) == values(a));
  CHECK_FALSE(ops::cat({a}, 1).shares_storage_with(a));
  // Empty pieces, including torch's legacy 1-d [0].
  CHECK(values(ops::cat({ops::empty({0, 3}), a, ops::empty({0})}, 0)) == values(a));
  CHECK(ops::cat({ops::empty({0}), ops::empty({0})}, 0).sizes() == Shape{0});
  CHECK(ops::cat({ops::empty({2, 0}), ops::empty({2, 0})}, 1).sizes() == Shape{2, 0});
  CHECK(ops::cat({a, b}, 0).dtype() == DType::f32);

  CHECK_THROWS_WITH_AS(ops::cat({a, iota({2, 4})}, 0),
                       doctest::Contains("cat: tensor 1 has shape [2, 4], which differs from [2, 3] outside dim 0"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::cat({a, ops::to(b, DType::f64)}, 0),
                       doctest::Contains("cat: tensor 1 has dtype f64, expected f32"), Error);
  CHECK_THROWS_WITH_AS(ops::cat({a, ops::to(b, kMeta)}, 0), doctest::Contains("cat: tensor 1 is on meta"), Error);
  CHECK_THROWS_AS(ops::cat({}, 0), Error);
  CHECK_THROWS_AS(ops::cat({a, iota({3})}, 0), Error);
  CHECK_THROWS_AS(ops::cat({a, b}, 2), Error);
  CHECK_THROWS_AS(ops::cat({ops::scalar_tensor(1), ops::scalar_tensor(2)}, 0), Error);
}

TEST_CASE("stack") {
  Tensor a = iota({2, 2});
  Tensor b = ops::full({2, 2}, 9.0);
  Tensor s0 = ops::stack({a, b}, 0);
  CHECK(s0.sizes() == Shape{2, 2, 2});
  CHECK(values(s0) == std::vector<float>{0, 1, 2, 3, 9, 9, 9, 9});
  Tensor s2 = ops::stack({a, b}, -1);
  CHECK(s2.sizes() == Shape{2, 2, 2});
  CHECK(values(s2) == std::vector<float>{0, 9, 1, 9, 2, 9, 3, 9});
  CHECK(ops::stack({ops::scalar_tensor(1), ops::scalar_tensor(2)}, 0).sizes() == Shape{2});
  CHECK_THROWS_WITH_AS(ops::stack({a, iota({4})}, 0),
                       doctest::Contains("stack: tensor 1 has shape [4], expected [2, 2] like tensor 0"), Error);
  CHECK_THROWS_AS(ops::stack({a, b}, 3), Error);
}

TEST_CASE("split, split_with_sizes and chunk return views") {
  Tensor x = iota({7, 2});
  auto parts = ops::split(x, 3, 0);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].sizes() == Shape{3, 2});
  CHECK(parts[2].sizes() == Shape{1, 2});
  CHECK(values(parts[2]) == std::vector<float>{12, 13});
  CHECK(parts[1].shares_storage_with(x));
  CHECK(ops::split(x, 10, 0).size() == 1);
  CHECK(ops::split(ops::empty({0, 2}), 0, 0).size() == 1);
  CHECK_THROWS_WITH_AS(ops::split(x, 0, 0), doctest::Contains("split: split_size must be positive, got 0"), Error);

  auto sized = ops::split_with_sizes(x, {1, 0, 6}, 0);
  REQUIRE(sized.size() == 3);
  CHECK(sized[1].numel() == 0);
  CHECK(values(sized[2]) == range(2, 13));
  auto columns = ops::split_with_sizes(x, {1, 1}, -1);
  CHECK(values(columns[1]) == std::vector<float>{1, 3, 5, 7, 9, 11, 13});
  CHECK_THROWS_WITH_AS(
      ops::split_with_sizes(x, {3, 3}, 0),
      doctest::Contains("split_with_sizes: sizes [3, 3] sum to 6, but dim 0 of shape [7, 2] has size 7"), Error);
  CHECK_THROWS_AS(ops::split_with_sizes(x, {8, -1}, 0), Error);

  // torch semantics: ceil-sized chunks, possibly fewer than asked for.
  auto five = ops::chunk(iota({5}), 3, 0);
  REQUIRE(five.size() == 3);
  CHECK(five[0].numel() == 2);
  CHECK(five[2].numel() == 1);
  auto six = ops::chunk(iota({6}), 4, 0);
  REQUIRE(six.size() == 3);
  CHECK(values(six[2]) == std::vector<float>{4, 5});
  CHECK(ops::chunk(iota({2}), 5, 0).size() == 2);
  CHECK(ops::chunk(ops::empty({0}), 3, 0).size() == 3);
  CHECK_THROWS_WITH_AS(ops::chunk(x, 0, 0), doctest::Contains("chunk: number of chunks must be positive, got 0"),
                       Error);
  CHECK_THROWS_AS(ops::chunk(x, 2, 2), Error);
}

TEST_CASE("index_select along any dim") {
  Tensor x = iota({4, 3, 2});
  Tensor rows = ops::index_select(x, 0, ops::from_vector(std::vector<int64_t>{3, 0, 3}, {3}));
  CHECK(rows.sizes() == Shape{3, 3, 2});
  CHECK(values(rows) == std::vector<float>{18, 19, 20, 21, 22, 23, 0, 1, 2, 3, 4, 5, 18, 19, 20, 21, 22, 23});
  Tensor index32 = ops::from_vector(std::vector<int64_t>{2, 1}, {2}, {.dtype = DType::i32});
  Tensor middle = ops::index_select(x, 1, index32);
  CHECK(middle.sizes() == Shape{4, 2, 2});
  CHECK(values(ops::select(middle, 0, 1)) == std::vector<float>{10, 11, 8, 9});
  Tensor last = ops::index_select(x, -1, ops::from_vector(std::vector<int64_t>{1}, {1}));
  CHECK(last.sizes() == Shape{4, 3, 1});
  CHECK(values(ops::squeeze(last, -1)) == std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
  // Strided input and strided index, other dtypes.
  Tensor t = ops::transpose(iota({3, 4}, DType::i64), 0, 1);  // [4, 3]
  Tensor every_other = ops::slice(ops::from_vector(std::vector<int64_t>{3, 9, 1, 9}, {4}), 0, 0, 4, 2);
  CHECK(ops::index_select(t, 0, every_other).to_vector<int64_t>() == std::vector<int64_t>{3, 7, 11, 1, 5, 9});
  Tensor halves = ops::to(iota({3, 2}), DType::bf16);
  CHECK(values(ops::index_select(halves, 0, ops::from_vector(std::vector<int64_t>{2}, {1}))) ==
        std::vector<float>{4, 5});
  CHECK(ops::index_select(x, 0, ops::empty({0}, {.dtype = DType::i64})).sizes() == Shape{0, 3, 2});

  CHECK_THROWS_WITH_AS(ops::index_select(x, 0, ops::from_vector(std::vector<int64_t>{1, 4}, {2})),
                       doctest::Contains("index_select: index 4 at position 1 is out of range for dim 0 of size 4"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::index_select(x, 0, ops::from_vector(std::vector<int64_t>{-1}, {1})),
                       doctest::Contains("index -1 at position 0 is out of range"), Error);
  CHECK_THROWS_WITH_AS(ops::index_select(x, 0, ops::from_vector(std::vector<float>{1}, {1})),
                       doctest::Contains("index_select: index must be i32 or i64, got f32"), Error);
  CHECK_THROWS_WITH_AS(ops::index_select(x, 0, ops::from_vector(std::vector<int64_t>{1}, {1, 1})),
                       doctest::Contains("index_select: index must be 1-d, got shape [1, 1]"), Error);
  CHECK_THROWS_AS(ops::index_select(x, 3, ops::from_vector(std::vector<int64_t>{0}, {1})), Error);
  CHECK_THROWS_AS(ops::index_select(x, 0, Tensor()), Error);
}

TEST_CASE("index_add_ accumulates duplicates") {
  Tensor out = ops::zeros({4, 2});
  Tensor index = ops::from_vector(std::vector<int64_t>{1, 3, 1, 1}, {4});
  ops::index_add_(out, 0, index, iota({4, 2}));
  CHECK(values(out) == std::vector<float>{0, 0, 0 + 4 + 6, 1 + 5 + 7, 0, 0, 2, 3});

  Tensor columns = ops::ones({2, 3}, {.dtype = DType::f64});
  ops::index_add_(columns, 1, ops::from_vector(std::vector<int64_t>{2, 2}, {2}, {.dtype = DType::i32}),
                  ops::to(iota({2, 2}), DType::f64));
  CHECK(columns.to_vector<double>() == std::vector<double>{1, 1, 2, 1, 1, 6});

  Tensor counts = ops::zeros({3}, {.dtype = DType::i64});
  ops::index_add_(counts, 0, ops::from_vector(std::vector<int64_t>{0, 2, 2, 2}, {4}),
                  ops::ones({4}, {.dtype = DType::i64}));
  CHECK(counts.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 3});

  // A strided out (a transposed view) is written through.
  Tensor base = ops::zeros({2, 3});
  Tensor view = ops::transpose(base, 0, 1);  // [3, 2]
  ops::index_add_(view, 0, ops::from_vector(std::vector<int64_t>{2, 0}, {2}), iota({2, 2}));
  CHECK(values(base) == std::vector<float>{2, 0, 0, 3, 0, 1});

  // bf16 accumulates in f32 and rounds once: 256 + 1 + 1 would stay 256 if rounded per add.
  Tensor half = ops::full({1}, 256.0, {.dtype = DType::bf16});
  ops::index_add_(half, 0, ops::from_vector(std::vector<int64_t>{0, 0}, {2}), ops::ones({2}, {.dtype = DType::bf16}));
  CHECK(half.item() == 258.0);

  // Source aliasing out reads the values before the update.
  Tensor alias = ops::from_vector(std::vector<float>{1, 2}, {2});
  ops::index_add_(alias, 0, ops::from_vector(std::vector<int64_t>{1, 0}, {2}), alias);
  CHECK(values(alias) == std::vector<float>{3, 3});

  Tensor f = ops::zeros({3, 2});
  CHECK_THROWS_WITH_AS(ops::index_add_(f, 0, ops::from_vector(std::vector<int64_t>{0, 3}, {2}), ops::ones({2, 2})),
                       doctest::Contains("index_add_: index 3 at position 1 is out of range for dim 0 of size 3"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::index_add_(f, 0, ops::from_vector(std::vector<int64_t>{0}, {1}), ops::ones({2, 2})),
                       doctest::Contains("index_add_: source shape [2, 2] should be [1, 2]"), Error);
  CHECK_THROWS_WITH_AS(
      ops::index_add_(f, 0, ops::from_vector(std::vector<int64_t>{0}, {1}), ops::ones({1, 2}, {.dtype = DType::f64})),
      doctest::Contains("index_add_: source dtype f64 differs from out dtype f32"), Error);
  Tensor flags = ops::zeros({2}, {.dtype = DType::boolean});
  CHECK_THROWS_AS(ops::index_add_(flags, 0, ops::from_vector(std::vector<int64_t>{0}, {1}),
                                  ops::ones({1}, {.dtype = DType::boolean})),
                  Error);
}

TEST_CASE("index_add_ on an embedding-sized gradient matches a naive loop") {
  // The embedding backward: [V, C] += rows of [N, C] at token ids, with repeats.
  const int64_t vocab = 50257, channels = 768, rows = 256;
  std::vector<int64_t> tokens(rows);
  for (int64_t i = 0; i < rows; ++i) tokens[i] = (i * 7919) % 97 * 518;  // 97 distinct ids, each repeated
  tokens[rows - 1] = vocab - 1;
  Tensor index = ops::from_vector(tokens, {rows});
  Tensor source = ops::randn({rows, channels}, PhiloxKey{3, 4});
  Tensor grad = ops::zeros({vocab, channels});
  ops::index_add_(grad, 0, index, source);

  const auto src = values(source);
  std::vector<float> expected(static_cast<size_t>(vocab * channels), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < channels; ++c) expected[tokens[i] * channels + c] += src[i * channels + c];
  }
  CHECK(values(grad) == expected);  // same order of additions: bit-identical

  // And index_select is its gather counterpart.
  Tensor gathered = ops::index_select(grad, 0, index);
  const auto got = values(gathered);
  bool rows_match = true;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < channels; ++c) rows_match &= got[i * channels + c] == expected[tokens[i] * channels + c];
  }
  CHECK(rows_match);
}

TEST_CASE("every shape op infers shapes on meta") {
  const TensorOptions meta{.device = kMeta};
  Tensor x = ops::empty({2, 3, 4}, meta);
  auto is_meta_with = [](const Tensor& t, const Shape& shape) { return t.is_meta() && t.sizes() == shape; };
  CHECK(is_meta_with(ops::view(x, {6, -1}), {6, 4}));
  CHECK(is_meta_with(ops::reshape(ops::transpose(x, 0, 2), {4, 6}), {4, 6}));
  CHECK(is_meta_with(ops::flatten(x, 1), {2, 12}));
  CHECK(is_meta_with(ops::permute(x, {2, 1, 0}), {4, 3, 2}));
  CHECK(is_meta_with(ops::narrow(x, 2, 1, 2), {2, 3, 2}));
  CHECK(is_meta_with(ops::slice(x, 1, 0, 3, 2), {2, 2, 4}));
  CHECK(is_meta_with(ops::select(x, 0, 1), {3, 4}));
  CHECK(is_meta_with(ops::squeeze(ops::unsqueeze(x, 1)), {2, 3, 4}));
  CHECK(is_meta_with(ops::expand(ops::empty({3, 1}, meta), {2, 3, 5}), {2, 3, 5}));
  CHECK(is_meta_with(ops::as_strided(x, {4}, {1}, 0), {4}));
  CHECK(is_meta_with(ops::cat({x, x}, 1), {2, 6, 4}));
  CHECK(is_meta_with(ops::stack({x, x}, 0), {2, 2, 3, 4}));
  CHECK(ops::split(x, 2, 1).size() == 2);
  CHECK(is_meta_with(ops::chunk(x, 2, 2)[1], {2, 3, 2}));
  Tensor index = ops::empty({5}, {.dtype = DType::i64, .device = kMeta});
  CHECK(is_meta_with(ops::index_select(x, 2, index), {2, 3, 5}));
  Tensor out = ops::empty({7, 4}, meta);
  ops::index_add_(out, 0, index, ops::empty({5, 4}, meta));
  CHECK(is_meta_with(out, {7, 4}));
  CHECK(is_meta_with(ops::contiguous(ops::transpose(x, 0, 1)), {3, 2, 4}));
  CHECK(is_meta_with(ops::clone(x), {2, 3, 4}));
  CHECK(ops::to(x, DType::bf16).dtype() == DType::bf16);
  // Errors are still errors on meta.
  CHECK_THROWS_AS(ops::view(ops::transpose(x, 0, 2), {24}), Error);
  CHECK_THROWS_AS(ops::cat({x, ops::empty({2, 3, 5}, meta)}, 1), Error);
  CHECK_THROWS_AS(ops::index_add_(out, 0, index, ops::empty({4, 4}, meta)), Error);
  CHECK_THROWS_AS(ops::index_select(x, 0, ops::zeros({5}, {.dtype = DType::i64})), Error);  // devices differ
}

TEST_CASE("printer") {
  CHECK(ops::to_string(ops::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2})) ==
        "tensor([[1.0000, 2.0000],\n"
        "        [3.0000, 4.0000]], shape=[2, 2], dtype=f32, device=cpu)");
  CHECK(ops::to_string(ops::from_vector(std::vector<float>{-1.5f, 10.25f}, {2})) ==
        "tensor([-1.5000, 10.2500], shape=[2], dtype=f32, device=cpu)");
  CHECK(ops::to_string(ops::scalar_tensor(2.5, {.dtype = DType::f64})) ==
        "tensor(2.5000, shape=[], dtype=f64, device=cpu)");
  CHECK(ops::to_string(ops::from_vector(std::vector<int64_t>{1, -20, 300}, {3})) ==
        "tensor([  1, -20, 300], shape=[3], dtype=i64, device=cpu)");
  CHECK(ops::to_string(ops::from_vector(std::vector<float>{1, 0}, {2}, {.dtype = DType::boolean})) ==
        "tensor([ true, false], shape=[2], dtype=bool, device=cpu)");
  CHECK(ops::to_string(ops::from_vector(std::vector<float>{1e-6f, 1}, {2})) ==
        "tensor([1.0000e-06, 1.0000e+00], shape=[2], dtype=f32, device=cpu)");
  CHECK(ops::to_string(ops::from_vector(std::vector<float>{NAN, -INFINITY, 0.5f}, {3})) ==
        "tensor([   nan,   -inf, 0.5000], shape=[3], dtype=f32, device=cpu)");
  CHECK(ops::to_string(iota({2, 1, 2}, DType::i32)) ==
        "tensor([[[0, 1]],\n"
        "\n"
        "        [[2, 3]]], shape=[2, 1, 2], dtype=i32, device=cpu)");
  CHECK(ops::to_string(ops::empty({0, 3})) == "tensor([], shape=[0, 3], dtype=f32, device=cpu)");
  CHECK(ops::to_string(ops::empty({2, 3}, {.dtype = DType::bf16, .device = kMeta})) ==
        "tensor(..., shape=[2, 3], dtype=bf16, device=meta)");
  CHECK(ops::to_string(Tensor()) == "tensor(undefined)");
  CHECK(ops::to_string(ops::zeros({1}, {.requires_grad = true})) ==
        "tensor([0.0000], shape=[1], dtype=f32, device=cpu, requires_grad=true)");
  // A strided view prints in logical order.
  CHECK(ops::to_string(ops::transpose(iota({2, 2}, DType::i64), 0, 1)) ==
        "tensor([[0, 2],\n"
        "        [1, 3]], shape=[2, 2], dtype=i64, device=cpu)");

  // Large tensors show three items at each end of every dim.
  const std::string big = ops::to_string(iota({100, 100}, DType::i64));
  CHECK(big.find("[[   0,    1,    2, ...,   97,   98,   99],") == 7);  // one width for all cells
  CHECK(big.find(" ...,\n") != std::string::npos);
  CHECK(big.find("[9900, 9901, 9902, ..., 9997, 9998, 9999]]") != std::string::npos);
  CHECK(big.find("shape=[100, 100], dtype=i64") != std::string::npos);
  CHECK(big.size() < 500);
  CHECK(ops::to_string(iota({1000})).find("...") == std::string::npos);  // at the threshold: everything
  CHECK(ops::to_string(iota({1001})).find("...") != std::string::npos);

  std::ostringstream stream;
  stream << ops::from_vector(std::vector<int64_t>{7}, {1});
  CHECK(stream.str() == "tensor([7], shape=[1], dtype=i64, device=cpu)");
}
