// Creation ops (constant, ranged, host values, Philox random fills), copies
// and conversions (dtype, device, meta), and element reads (item, to_vector).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "tensor/ops.h"

using namespace tessera;
namespace ops = tessera::ops;

namespace {

double mean_of(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double std_of(const std::vector<double>& values) {
  const double mean = mean_of(values);
  double squares = 0.0;
  for (double value : values) squares += (value - mean) * (value - mean);
  return std::sqrt(squares / static_cast<double>(values.size()));
}

}  // namespace

TEST_CASE("empty: contiguous geometry, counted bytes, checked sizes") {
  const auto before = memory_stats(kCPU);
  Tensor t = ops::empty({2, 3, 4}, {.dtype = DType::f64});
  CHECK(t.sizes() == Shape{2, 3, 4});
  CHECK(t.strides() == Shape{12, 4, 1});
  CHECK(t.storage_offset() == 0);
  CHECK(t.dtype() == DType::f64);
  CHECK(t.device() == kCPU);
  CHECK(t.is_contiguous());
  CHECK(t.numel() == 24);
  CHECK(t.nbytes() == 192);
  CHECK(memory_stats(kCPU).live_bytes - before.live_bytes == 192);
  CHECK_FALSE(t.requires_grad());

  Tensor scalar = ops::empty({});
  CHECK(scalar.dim() == 0);
  CHECK(scalar.numel() == 1);

  Tensor none = ops::empty({0, 5});
  CHECK(none.numel() == 0);
  CHECK(none.to_vector<float>().empty());

  CHECK(ops::empty({3}, {.requires_grad = true}).requires_grad());
  CHECK_THROWS_WITH_AS(ops::empty({2, -1}), doctest::Contains("empty: negative size in shape [2, -1]"), Error);
  CHECK_THROWS_WITH_AS(ops::empty({int64_t{1} << 40, int64_t{1} << 40}), doctest::Contains("too many elements"), Error);
  CHECK_THROWS_AS(ops::empty({3}, {.dtype = DType::i64, .requires_grad = true}), Error);
}

TEST_CASE("empty on meta allocates nothing") {
  const auto before = memory_stats(kCPU);
  Tensor t = ops::empty({1024, 1024}, {.device = kMeta});
  CHECK(t.is_meta());
  CHECK(t.sizes() == Shape{1024, 1024});
  CHECK(t.storage()->data() == nullptr);
  CHECK(t.storage()->bytes() == 0);
  CHECK(memory_stats(kCPU).live_bytes == before.live_bytes);
  Tensor z = ops::zeros({4, 4}, {.device = kMeta});
  CHECK(z.is_meta());
  CHECK(z.storage()->bytes() == 0);
}

TEST_CASE("zeros, ones, full and the *_like variants") {
  CHECK(ops::zeros({2, 2}).to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(ops::ones({3}, {.dtype = DType::i32}).to_vector<int32_t>() == std::vector<int32_t>{1, 1, 1});
  CHECK(ops::full({2}, 2.5, {.dtype = DType::f64}).to_vector<double>() == std::vector<double>{2.5, 2.5});
  // std::vector<bool> has no data(), so bools are read back as 0/1 integers.
  CHECK(ops::full({2}, 1.0, {.dtype = DType::boolean}).to_vector<int32_t>() == std::vector<int32_t>{1, 1});
  CHECK(ops::full({2}, 3.0, {.dtype = DType::bf16}).to_vector<float>() == std::vector<float>{3, 3});
  CHECK(ops::full({2}, -7.0, {.dtype = DType::i64}).to_vector<int64_t>() == std::vector<int64_t>{-7, -7});

  Tensor like = ops::transpose(ops::zeros({2, 3}, {.dtype = DType::f64}), 0, 1);
  Tensor e = ops::empty_like(like);
  CHECK(e.sizes() == Shape{3, 2});
  CHECK(e.dtype() == DType::f64);
  CHECK(e.is_contiguous());
  CHECK_FALSE(e.shares_storage_with(like));
  CHECK(ops::ones_like(like).to_vector<double>() == std::vector<double>(6, 1.0));
  CHECK(ops::zeros_like(ops::ones({2})).to_vector<float>() == std::vector<float>{0, 0});
  CHECK(ops::full_like(like, 4.0).to_vector<double>() == std::vector<double>(6, 4.0));
  CHECK(ops::full_like(ops::empty({2}, {.device = kMeta}), 1.0).is_meta());
  // A tensor with no elements is contiguous whatever its zero-sized dims.
  CHECK(ops::empty({2, 0}).is_contiguous());
  CHECK(ops::empty({0, 3}).is_contiguous());
}

TEST_CASE("arange") {
  CHECK(ops::arange(0, 5).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4});
  CHECK(ops::arange(1, 2, 0.25).to_vector<float>() == std::vector<float>{1, 1.25, 1.5, 1.75});
  CHECK(ops::arange(5, 0, -2).to_vector<float>() == std::vector<float>{5, 3, 1});
  CHECK(ops::arange(0, 10, 3, {.dtype = DType::i64}).to_vector<int64_t>() == std::vector<int64_t>{0, 3, 6, 9});
  CHECK(ops::arange(2, 2).numel() == 0);
  CHECK(ops::arange(0, 7, 1, {.device = kMeta}).sizes() == Shape{7});
  CHECK_THROWS_WITH_AS(ops::arange(0, 1, 0), doctest::Contains("arange: step must be nonzero"), Error);
  CHECK_THROWS_WITH_AS(ops::arange(0, 5, -1), doctest::Contains("arange: step -1 does not lead from 0 to 5"), Error);
  CHECK_THROWS_AS(ops::arange(0, INFINITY), Error);
}

TEST_CASE("from_vector and scalar_tensor") {
  Tensor f = ops::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(f.sizes() == Shape{2, 3});
  CHECK(f.dtype() == DType::f32);
  CHECK(f.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});

  Tensor d = ops::from_vector(std::vector<double>{0.1, -0.2}, {2}, {.dtype = DType::f64});
  CHECK(d.to_vector<double>() == std::vector<double>{0.1, -0.2});
  Tensor converted = ops::from_vector(std::vector<double>{1.5, -2.0}, {2}, {.dtype = DType::bf16});
  CHECK(converted.dtype() == DType::bf16);
  CHECK(converted.to_vector<float>() == std::vector<float>{1.5f, -2.0f});

  Tensor i = ops::from_vector(std::vector<int64_t>{3, -1, 1LL << 40}, {3});
  CHECK(i.dtype() == DType::i64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{3, -1, 1LL << 40});
  Tensor i32 = ops::from_vector(std::vector<int64_t>{3, -1}, {2}, {.dtype = DType::i32});
  CHECK(i32.to_vector<int32_t>() == std::vector<int32_t>{3, -1});

  Tensor meta = ops::from_vector(std::vector<float>{1, 2}, {2}, {.device = kMeta});
  CHECK(meta.is_meta());
  CHECK(meta.sizes() == Shape{2});
  CHECK(ops::from_vector(std::vector<float>{1}, {1}, {.requires_grad = true}).requires_grad());

  CHECK_THROWS_WITH_AS(ops::from_vector(std::vector<float>{1, 2, 3}, {2, 2}),
                       doctest::Contains("from_vector: 3 values do not fill shape [2, 2] (4 elements)"), Error);

  Tensor s = ops::scalar_tensor(2.5, {.dtype = DType::f64});
  CHECK(s.dim() == 0);
  CHECK(s.item() == 2.5);
  CHECK(ops::scalar_tensor(3, {.dtype = DType::i32}).item<int>() == 3);
}

TEST_CASE("item and to_vector") {
  Tensor t = ops::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  // to_vector reads in logical order, whatever the strides.
  CHECK(ops::transpose(t, 0, 1).to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(ops::slice(t, 1, 0, 3, 2).to_vector<int64_t>() == std::vector<int64_t>{1, 3, 4, 6});
  CHECK(ops::select(ops::select(t, 0, 1), 0, 2).item() == 6.0);
  CHECK(ops::from_vector(std::vector<float>{7}, {1, 1}).item() == 7.0);
  CHECK_THROWS_WITH_AS(t.item(), doctest::Contains("item: tensor of shape [2, 3] has 6 elements"), Error);
  Tensor meta = ops::empty({1}, {.device = kMeta});
  CHECK_THROWS_WITH_AS(meta.item(), doctest::Contains("meta tensor has no data"), Error);
  CHECK_THROWS_WITH_AS(meta.to_vector<float>(), doctest::Contains("meta tensor has no data"), Error);
  CHECK_THROWS_AS(Tensor().item(), Error);
}

TEST_CASE("rand and randn: Philox values by logical index") {
  const PhiloxKey key{42, 7};
  Tensor a = ops::rand({1000}, key);
  Tensor b = ops::rand({1000}, key);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != ops::rand({1000}, PhiloxKey{42, 8}).to_vector<float>());
  CHECK(a.to_vector<float>() != ops::rand({1000}, PhiloxKey{43, 7}).to_vector<float>());
  // Element i is philox_uniform(key, i), whatever the shape.
  const auto values = ops::rand({10, 100}, key).to_vector<float>();
  CHECK(values == a.to_vector<float>());
  for (uint64_t i : {0u, 1u, 517u, 999u}) CHECK(values[i] == philox_uniform(key, i));
  const auto normals = ops::randn({8}, key, {.dtype = DType::f64}).to_vector<double>();
  for (uint64_t i = 0; i < 8; ++i) CHECK(normals[i] == doctest::Approx(philox_normal(key, i)).epsilon(1e-12));

  CHECK(ops::rand({3}, key, {.dtype = DType::bf16}).dtype() == DType::bf16);
  CHECK(ops::randn({3}, key, {.requires_grad = true}).requires_grad());
  CHECK(ops::rand({3, 3}, key, {.device = kMeta}).is_meta());
  CHECK_THROWS_WITH_AS(ops::rand({3}, key, {.dtype = DType::i32}), doctest::Contains("rand: needs a floating dtype"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::randn({3}, key, {.dtype = DType::boolean}),
                       doctest::Contains("randn: needs a floating dtype"), Error);
}

TEST_CASE("rand without a key draws from the default generator") {
  manual_seed(1234);
  const auto first = ops::rand({16}).to_vector<float>();
  const auto second = ops::randn({16}).to_vector<float>();
  CHECK(first != second);
  manual_seed(1234);
  CHECK(ops::rand({16}).to_vector<float>() == first);
  CHECK(ops::randn({16}).to_vector<float>() == second);
  CHECK(ops::rand({16}).to_vector<float>() != first);  // the next key is a new stream
}

TEST_CASE("uniform_ and normal_ with first_index fill a shard like the whole") {
  const PhiloxKey key{5, 99};
  const Tensor whole = ops::rand({10, 12}, key);  // a [10, 12] parameter
  // A rank that owns rows [4, 7) fills only them, starting at flat index 4 * 12.
  Tensor shard = ops::empty({3, 12});
  ops::uniform_(shard, key, 0.0, 1.0, 4 * 12);
  CHECK(shard.to_vector<float>() == ops::narrow(whole, 0, 4, 3).to_vector<float>());

  const Tensor whole_normal = ops::randn({64}, key, {.dtype = DType::f64});
  Tensor tail = ops::empty({24}, {.dtype = DType::f64});
  ops::normal_(tail, key, 0.0, 1.0, 40);
  CHECK(tail.to_vector<double>() == ops::narrow(whole_normal, 0, 40, 24).to_vector<double>());

  // A strided destination gets the values in its logical order.
  Tensor base = ops::zeros({12, 10});
  Tensor transposed = ops::transpose(base, 0, 1);  // [10, 12] view
  ops::uniform_(transposed, key, 0.0, 1.0);
  CHECK(transposed.to_vector<float>() == whole.to_vector<float>());

  Tensor meta = ops::empty({4}, {.device = kMeta});
  ops::normal_(meta, key, 0.0, 1.0);
  CHECK(meta.is_meta());
  Tensor ints = ops::empty({4}, {.dtype = DType::i64});
  CHECK_THROWS_WITH_AS(ops::uniform_(ints, key, 0, 1), doctest::Contains("uniform_: needs a floating dtype"), Error);
  Tensor floats = ops::empty({4});
  CHECK_THROWS_WITH_AS(ops::uniform_(floats, key, 2, 1), doctest::Contains("uniform_: low 2 is above high 1"), Error);
  CHECK_THROWS_WITH_AS(ops::normal_(floats, key, 0, -1), doctest::Contains("normal_: std must be >= 0"), Error);
}

TEST_CASE("uniform_ and normal_ statistics") {
  // Bounds of 6 or more standard errors of each statistic at these sample
  // sizes (Philox makes the samples the same on every machine; a generator
  // that drifted by a few standard errors would fail).
  const auto within = [](double value, double expected, double bound) { return std::abs(value - expected) <= bound; };
  const PhiloxKey key{2024, 1};
  Tensor u = ops::empty({200000}, {.dtype = DType::f64});
  ops::uniform_(u, key, 2.0, 5.0);
  const auto uniform = u.to_vector<double>();
  CHECK(*std::min_element(uniform.begin(), uniform.end()) >= 2.0);
  CHECK(*std::max_element(uniform.begin(), uniform.end()) < 5.0);
  CHECK(within(mean_of(uniform), 3.5, 0.012));                    // se 0.866 / sqrt(n) = 0.0019
  CHECK(within(std_of(uniform), 3.0 / std::sqrt(12.0), 0.006));  // se 0.866 sqrt(0.8 / 4n) = 0.00087

  Tensor n = ops::empty({200000});
  ops::normal_(n, key, 1.0, 2.0);
  const auto normal = n.to_vector<double>();
  CHECK(within(mean_of(normal), 1.0, 0.027));  // se 2 / sqrt(n) = 0.0045
  CHECK(within(std_of(normal), 2.0, 0.019));   // se 2 / sqrt(2n) = 0.0032
  // The fraction within one std of the mean is about 68.3%.
  const auto inside = std::count_if(normal.begin(), normal.end(), [](double v) { return std::abs(v - 1.0) < 2.0; });
  CHECK(within(static_cast<double>(inside) / 200000.0, 0.6827, 0.0063));  // se 0.00104

  Tensor half = ops::empty({50000}, {.dtype = DType::bf16});
  ops::normal_(half, key, 0.0, 0.02);
  CHECK(within(std_of(half.to_vector<double>()), 0.02, 4e-4));  // se 0.02 / sqrt(2n) = 6.3e-5
}

TEST_CASE("copy_: broadcast, dtype conversion, strides") {
  Tensor dst = ops::zeros({2, 3});
  ops::copy_(dst, ops::from_vector(std::vector<float>{1, 2, 3}, {3}));
  CHECK(dst.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  ops::copy_(dst, ops::from_vector(std::vector<double>{7, 8}, {2, 1}, {.dtype = DType::f64}));
  CHECK(dst.to_vector<float>() == std::vector<float>{7, 7, 7, 8, 8, 8});
  ops::copy_(dst, ops::scalar_tensor(-1, {.dtype = DType::i64}));
  CHECK(dst.to_vector<float>() == std::vector<float>(6, -1.0f));

  // Into a transposed view: the base sees the transpose.
  Tensor base = ops::zeros({3, 2}, {.dtype = DType::i32});
  Tensor view = ops::transpose(base, 0, 1);
  ops::copy_(view, ops::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
  CHECK(base.to_vector<int32_t>() == std::vector<int32_t>{1, 4, 2, 5, 3, 6});

  Tensor flags = ops::empty({3}, {.dtype = DType::boolean});
  ops::copy_(flags, ops::from_vector(std::vector<float>{0, 2, -0.5}, {3}));
  CHECK(flags.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 1});

  CHECK_THROWS_WITH_AS(ops::copy_(dst, ops::zeros({3, 3})),
                       doctest::Contains("copy_: source shape [3, 3] does not broadcast to destination shape [2, 3]"),
                       Error);
  CHECK_THROWS_AS(ops::copy_(dst, ops::zeros({1, 2, 3})), Error);
  Tensor expanded = ops::expand(ops::zeros({1, 3}), {4, 3});
  CHECK_THROWS_WITH_AS(ops::copy_(expanded, ops::ones({4, 3})), doctest::Contains("share memory"), Error);
  Tensor undefined;
  CHECK_THROWS_AS(ops::copy_(dst, undefined), Error);
}

TEST_CASE("copy_ between overlapping views of one storage") {
  // Shift right by one: each element must be read before it is overwritten.
  Tensor x = ops::arange(0, 6);
  Tensor dst = ops::narrow(x, 0, 1, 5);
  ops::copy_(dst, ops::narrow(x, 0, 0, 5));
  CHECK(x.to_vector<float>() == std::vector<float>{0, 0, 1, 2, 3, 4});
  // Shift left.
  Tensor y = ops::arange(0, 6);
  Tensor left = ops::narrow(y, 0, 0, 5);
  ops::copy_(left, ops::narrow(y, 0, 1, 5));
  CHECK(y.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 5});
  // In-place transpose of a square matrix.
  Tensor m = ops::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  ops::copy_(m, ops::transpose(m, 0, 1));
  CHECK(m.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
  // Copy onto itself is a no-op.
  ops::copy_(m, m);
  CHECK(m.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
}

TEST_CASE("copy_ with meta tensors") {
  Tensor meta = ops::empty({2, 3}, {.device = kMeta});
  ops::copy_(meta, ops::ones({2, 3}));  // shape-only
  CHECK(meta.is_meta());
  CHECK_THROWS_AS(ops::copy_(meta, ops::ones({4})), Error);  // shapes are still checked
  Tensor cpu = ops::zeros({2, 3});
  CHECK_THROWS_WITH_AS(ops::copy_(cpu, meta), doctest::Contains("meta tensor has no data"), Error);
}

TEST_CASE("fill_ and zero_ on contiguous, strided and expanded tensors") {
  Tensor x = ops::zeros({3, 4});
  ops::fill_(x, 2.0);
  CHECK(x.to_vector<float>() == std::vector<float>(12, 2.0f));
  Tensor column = ops::select(x, 1, 2);  // stride 4
  ops::fill_(column, 5.0);
  CHECK(x.to_vector<float>() == std::vector<float>{2, 2, 5, 2, 2, 2, 5, 2, 2, 2, 5, 2});
  Tensor rows = ops::slice(x, 0, 0, 3, 2);
  ops::zero_(rows);
  CHECK(x.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 2, 2, 5, 2, 0, 0, 0, 0});

  Tensor small = ops::zeros({1, 3}, {.dtype = DType::i64});
  Tensor expanded = ops::expand(small, {5, 3});
  ops::fill_(expanded, 9.0);
  CHECK(small.to_vector<int64_t>() == std::vector<int64_t>{9, 9, 9});

  Tensor meta = ops::empty({2}, {.device = kMeta});
  ops::fill_(meta, 1.0);
  CHECK(meta.is_meta());
}

TEST_CASE("clone and contiguous") {
  Tensor x = ops::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor c = ops::clone(x);
  CHECK_FALSE(c.shares_storage_with(x));
  CHECK(c.to_vector<float>() == x.to_vector<float>());
  Tensor view = ops::transpose(x, 0, 1);
  Tensor cloned_view = ops::clone(view);
  CHECK(cloned_view.is_contiguous());
  CHECK(cloned_view.sizes() == Shape{3, 2});
  CHECK(cloned_view.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});

  CHECK(ops::contiguous(x).is_same(x));
  Tensor made = ops::contiguous(view);
  CHECK_FALSE(made.shares_storage_with(x));
  CHECK(made.is_contiguous());
  CHECK(made.strides() == Shape{2, 1});
  CHECK(made.to_vector<float>() == view.to_vector<float>());
  CHECK(ops::contiguous(ops::narrow(x, 0, 1, 1)).shares_storage_with(x));  // a contiguous slice stays a view

  Tensor meta = ops::clone(ops::empty({2, 3}, {.device = kMeta}));
  CHECK(meta.is_meta());
  CHECK(meta.sizes() == Shape{2, 3});
}

TEST_CASE("to(dtype): conversions and 16-bit round trips") {
  Tensor x = ops::from_vector(std::vector<float>{1.5f, -2.25f, 1000.0f}, {3});
  CHECK(ops::to(x, DType::f32).is_same(x));
  CHECK(ops::to(x, DType::f64).to_vector<double>() == std::vector<double>{1.5, -2.25, 1000.0});
  CHECK(ops::to(ops::to(x, DType::bf16), DType::f32).to_vector<float>() == x.to_vector<float>());
  CHECK(ops::to(ops::to(x, DType::f16), DType::f32).to_vector<float>() == x.to_vector<float>());
  CHECK(ops::to(ops::from_vector(std::vector<float>{0, 3, 0.5}, {3}), DType::boolean).to_vector<int32_t>() ==
        std::vector<int32_t>{0, 1, 1});
  CHECK(ops::to(ops::from_vector(std::vector<int64_t>{-3, 5}, {2}), DType::f32).to_vector<float>() ==
        std::vector<float>{-3, 5});

  // Round to nearest, ties to even. bf16 keeps 7 mantissa bits: 1 + 2^-8 is a
  // tie between 1 (even) and 1 + 2^-7; 1 + 3 * 2^-8 a tie between 1 + 2^-7
  // (odd) and 1 + 2^-6 (even); just above a tie rounds up.
  const float one = 1.0f;
  Tensor ties = ops::from_vector(std::vector<float>{one + std::ldexp(1.0f, -8), one + 3 * std::ldexp(1.0f, -8),
                                                    one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -16)},
                                 {3});
  CHECK(ops::to(ops::to(ties, DType::bf16), DType::f32).to_vector<float>() ==
        std::vector<float>{1.0f, one + std::ldexp(1.0f, -6), one + std::ldexp(1.0f, -7)});
  // f16 keeps 10 mantissa bits, overflows to inf past 65504 and has subnormals down to 2^-24.
  Tensor half_ties = ops::from_vector(std::vector<float>{one + std::ldexp(1.0f, -11), one + 3 * std::ldexp(1.0f, -11),
                                                         70000.0f, std::ldexp(1.0f, -24), -65504.0f},
                                      {5});
  const auto halves = ops::to(ops::to(half_ties, DType::f16), DType::f32).to_vector<float>();
  CHECK(halves[0] == 1.0f);
  CHECK(halves[1] == one + std::ldexp(1.0f, -9));
  CHECK(std::isinf(halves[2]));
  CHECK(halves[3] == std::ldexp(1.0f, -24));
  CHECK(halves[4] == -65504.0f);
  // NaN stays NaN through both formats.
  Tensor nan = ops::full({1}, std::numeric_limits<double>::quiet_NaN());
  CHECK(std::isnan(ops::to(nan, DType::bf16).item()));
  CHECK(std::isnan(ops::to(nan, DType::f16).item()));
  CHECK(ops::to(ops::full({1}, 3.0, {.dtype = DType::f64}), DType::bf16).item() == 3.0);

  // A strided source converts in logical order.
  Tensor m = ops::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor converted = ops::to(ops::transpose(m, 0, 1), DType::bf16);
  CHECK(converted.is_contiguous());
  CHECK(converted.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
  Tensor meta = ops::to(ops::empty({2}, {.device = kMeta}), DType::f16);
  CHECK(meta.is_meta());
  CHECK(meta.dtype() == DType::f16);
}

TEST_CASE("to(device) and to_empty") {
  Tensor x = ops::ones({2, 3});
  CHECK(ops::to(x, kCPU).is_same(x));
  Tensor meta = ops::to(x, kMeta);
  CHECK(meta.is_meta());
  CHECK(meta.sizes() == Shape{2, 3});
  CHECK(meta.dtype() == DType::f32);
  CHECK_THROWS_WITH_AS(ops::to(meta, kCPU), doctest::Contains("meta tensor has no data"), Error);

  Tensor model = ops::empty({4, 5}, {.dtype = DType::bf16, .device = kMeta});
  Tensor materialised = ops::to_empty(model, kCPU);
  CHECK(materialised.device() == kCPU);
  CHECK(materialised.sizes() == Shape{4, 5});
  CHECK(materialised.dtype() == DType::bf16);
  CHECK(materialised.storage()->bytes() == 40);
  CHECK(ops::to_empty(x, kMeta).is_meta());
}

TEST_CASE("to_vector reads bool tensors, converting from any dtype") {
  const Tensor mask = ops::gt(ops::from_vector(std::vector<float>{-1.0f, 0.5f, 0.0f, 2.0f}, {2, 2}), 0.0);
  CHECK(mask.to_vector<bool>() == std::vector<bool>{false, true, false, true});
  const Tensor values = ops::from_vector(std::vector<double>{0.0, 3.0, -0.0, 1e-30}, {4});
  CHECK(values.to_vector<bool>() == std::vector<bool>{false, true, false, true});
}

TEST_CASE("contiguous strides: row-major, and saturated where only an empty tensor's extents overflow") {
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(contiguous_strides({2, 0, 4}) == Shape{4, 4, 1});
  const int64_t big = int64_t{1} << 50;
  CHECK(contiguous_strides({0, big, big}) == Shape{std::numeric_limits<int64_t>::max(), big, 1});
  const Tensor empty = ops::empty({0, big, big});
  CHECK(empty.numel() == 0);
  CHECK(empty.strides()[1] == big);
}

TEST_CASE("u8 holds raw bytes: all 256 values through copies, views, joins and casts; no arithmetic") {
  std::vector<uint8_t> all(256);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i);
  const Tensor bytes = ops::from_vector(all, {16, 16});
  CHECK(bytes.dtype() == DType::u8);
  CHECK(bytes.nbytes() == 256);
  CHECK(dtype_from_name("u8") == DType::u8);
  CHECK(ops::clone(bytes).to_vector<uint8_t>() == all);
  std::vector<uint8_t> transposed;
  for (int64_t column = 0; column < 16; ++column) {
    for (int64_t row = 0; row < 16; ++row) transposed.push_back(all[static_cast<size_t>(row * 16 + column)]);
  }
  CHECK(ops::contiguous(ops::transpose(bytes, 0, 1)).to_vector<uint8_t>() == transposed);
  CHECK(ops::cat({ops::narrow(bytes, 0, 0, 5), ops::narrow(bytes, 0, 5, 11)}, 0).to_vector<uint8_t>() == all);
  Tensor strided = ops::transpose(ops::zeros({16, 16}, {.dtype = DType::u8}), 0, 1);
  ops::copy_(strided, bytes);
  CHECK(ops::contiguous(strided).to_vector<uint8_t>() == all);
  // Casts: to floats exactly; from floats saturating to [0, 255], NaN to 0;
  // from wider integers modulo 256.
  std::vector<float> widened(all.begin(), all.end());
  CHECK(ops::to(bytes, DType::f32).to_vector<float>() == widened);
  CHECK(ops::to(ops::to(bytes, DType::bf16), DType::u8).to_vector<uint8_t>() == all);
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor floats =
      ops::from_vector(std::vector<float>{-3.0f, -0.5f, 0.7f, 254.9f, 255.5f, 300.0f, NAN, inf, -inf}, {9});
  CHECK(ops::to(floats, DType::u8).to_vector<uint8_t>() == std::vector<uint8_t>{0, 0, 0, 254, 255, 255, 0, 255, 0});
  CHECK(ops::to(ops::from_vector(std::vector<int64_t>{256, -1, 513}, {3}), DType::u8).to_vector<uint8_t>() ==
        std::vector<uint8_t>{0, 255, 1});
  CHECK_THROWS_WITH_AS(ops::add(bytes, bytes), doctest::Contains("u8 is a dtype of raw bytes"), Error);
  CHECK_THROWS_WITH_AS(ops::mul(bytes, 2.0), doctest::Contains("u8 is a dtype of raw bytes"), Error);
}
