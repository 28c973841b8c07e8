// nn::init: sliced init is bitwise the whole tensor's rows, the distributions
// have the documented scales, meta tensors are left alone, bad slices throw.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "nn/init.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

struct Moments {
  double mean = 0.0, std = 0.0, min = 0.0, max = 0.0;
};

Moments moments_of(const Tensor& tensor) {
  const std::vector<double> values = tensor.to_vector<double>();
  Moments m{0.0, 0.0, values.at(0), values.at(0)};
  for (double v : values) {
    m.mean += v;
    m.min = std::min(m.min, v);
    m.max = std::max(m.max, v);
  }
  m.mean /= static_cast<double>(values.size());
  for (double v : values) m.std += (v - m.mean) * (v - m.mean);
  m.std = std::sqrt(m.std / static_cast<double>(values.size()));
  return m;
}

const PhiloxKey kKey{42, stream_id_for("layer.weight")};

// Statistics of n draws are checked to 5 standard errors: a correct
// initialiser fails such a check once in 1.7 million (and the keys are fixed,
// so a pass holds for good). The standard error of a sample mean is
// sigma / sqrt(n); of a sample std, sigma * sqrt((kurtosis - 1) / (4n)), with
// kurtosis 3 for a normal and 9/5 for a uniform.
constexpr double kNormalKurtosis = 3.0, kUniformKurtosis = 1.8;

void check_mean(const Tensor& t, double mean, double sigma) {
  CHECK(std::abs(moments_of(t).mean - mean) <= 5.0 * sigma / std::sqrt(static_cast<double>(t.numel())));
}

void check_std(const Tensor& t, double sigma, double kurtosis) {
  const double standard_error = sigma * std::sqrt((kurtosis - 1.0) / (4.0 * static_cast<double>(t.numel())));
  CHECK(std::abs(moments_of(t).std - sigma) <= 5.0 * standard_error);
}

}  // namespace

TEST_CASE("init: a row slice initialised alone has the bits the whole tensor has there") {
  Tensor whole = ops::empty({10, 4});
  Tensor rows = ops::empty({4, 4});  // rows [3, 7)
  const nn::init::RowSlice slice{.global_shape = {10, 4}, .row_offset = 3};

  auto rows_of_whole = [&] { return ops::contiguous(ops::narrow(whole, 0, 3, 4)).to_vector<float>(); };

  nn::init::normal_(whole, kKey, 0.5, 2.0);
  nn::init::normal_(rows, kKey, 0.5, 2.0, slice);
  CHECK(rows.to_vector<float>() == rows_of_whole());

  nn::init::uniform_(whole, kKey, -1.0, 3.0);
  nn::init::uniform_(rows, kKey, -1.0, 3.0, slice);
  CHECK(rows.to_vector<float>() == rows_of_whole());

  // Fan-based initialisers take their fans from the global shape.
  nn::init::xavier_uniform_(whole, kKey);
  nn::init::xavier_uniform_(rows, kKey, 1.0, slice);
  CHECK(rows.to_vector<float>() == rows_of_whole());
  nn::init::xavier_normal_(whole, kKey, 2.0);
  nn::init::xavier_normal_(rows, kKey, 2.0, slice);
  CHECK(rows.to_vector<float>() == rows_of_whole());
  nn::init::kaiming_uniform_(whole, kKey, 0.1, nn::init::FanMode::fan_out);
  nn::init::kaiming_uniform_(rows, kKey, 0.1, nn::init::FanMode::fan_out, slice);
  CHECK(rows.to_vector<float>() == rows_of_whole());
  nn::init::kaiming_normal_(whole, kKey);
  nn::init::kaiming_normal_(rows, kKey, 0.0, nn::init::FanMode::fan_in, slice);
  CHECK(rows.to_vector<float>() == rows_of_whole());

  // Every element of the whole is covered exactly once by adjacent slices.
  std::vector<float> stitched;
  for (auto [offset, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 4}, {7, 3}}) {
    Tensor part = ops::empty({count, 4});
    nn::init::normal_(part, kKey, 0.0, 1.0, {.global_shape = {10, 4}, .row_offset = offset});
    for (float v : part.to_vector<float>()) stitched.push_back(v);
  }
  nn::init::normal_(whole, kKey, 0.0, 1.0);
  CHECK(stitched == whole.to_vector<float>());
}

TEST_CASE("init: slices that do not fit the global shape throw") {
  Tensor rows = ops::empty({4, 4});
  CHECK_THROWS_WITH_AS(nn::init::normal_(rows, kKey, 0, 1, {.global_shape = {10, 4}, .row_offset = 7}),
                       "init::normal_: rows [7, 11) are outside the global shape [10, 4]", Error);
  CHECK_THROWS_WITH_AS(nn::init::normal_(rows, kKey, 0, 1, {.global_shape = {10, 5}, .row_offset = 0}),
                       "init::normal_: local shape [4, 4] is not a row slice of global shape [10, 5]", Error);
  CHECK_THROWS_AS(nn::init::uniform_(rows, kKey, 0, 1, {.global_shape = {}, .row_offset = 2}), Error);
  CHECK_THROWS_AS(nn::init::uniform_(rows, kKey, 1, 0), Error);
  CHECK_THROWS_AS(nn::init::normal_(rows, kKey, 0, -1), Error);
  Tensor vector = ops::empty({4});
  CHECK_THROWS_WITH_AS(nn::init::xavier_uniform_(vector, kKey),
                       "init: fan in and fan out need a tensor of dim >= 2, got shape [4]", Error);
}

TEST_CASE("init: fans follow torch ([out, in, *receptive])") {
  CHECK(nn::init::fans({8, 3}) == std::pair<int64_t, int64_t>{3, 8});
  CHECK(nn::init::fans({8, 3, 5, 5}) == std::pair<int64_t, int64_t>{75, 200});
}

TEST_CASE("init: distributions have the documented scale") {
  Tensor t = ops::empty({256, 128});
  nn::init::normal_(t, kKey, 1.0, 0.02);
  check_mean(t, 1.0, 0.02);
  check_std(t, 0.02, kNormalKurtosis);

  nn::init::uniform_(t, kKey, -2.0, 3.0);
  Moments m = moments_of(t);
  CHECK(m.min >= -2.0);
  CHECK(m.max < 3.0);
  check_mean(t, 0.5, 5.0 / std::sqrt(12.0));

  // fan_in 128, fan_out 256. A uniform draw stays below 0.99 of its bound
  // with probability 0.995: all 32768 of them, e^-164.
  nn::init::xavier_uniform_(t, kKey);
  m = moments_of(t);
  const double xavier_bound = std::sqrt(6.0 / 384.0);
  CHECK(m.max <= xavier_bound);
  CHECK(m.max > 0.99 * xavier_bound);
  check_std(t, xavier_bound / std::sqrt(3.0), kUniformKurtosis);

  nn::init::xavier_normal_(t, kKey);
  check_std(t, std::sqrt(2.0 / 384.0), kNormalKurtosis);

  nn::init::kaiming_uniform_(t, kKey);
  const double kaiming_bound = std::sqrt(3.0) * std::sqrt(2.0) / std::sqrt(128.0);
  m = moments_of(t);
  CHECK(m.max <= kaiming_bound);
  CHECK(m.max > 0.99 * kaiming_bound);

  nn::init::kaiming_normal_(t, kKey, 0.0, nn::init::FanMode::fan_out);
  check_std(t, std::sqrt(2.0 / 256.0), kNormalKurtosis);

  nn::init::ones_(t);
  CHECK(moments_of(t).min == 1.0);
  nn::init::zeros_(t);
  CHECK(moments_of(t).max == 0.0);
  nn::init::constant_(t, -3.5);
  CHECK(moments_of(t).mean == -3.5);
}

TEST_CASE("init: keys decide the values; meta tensors are left alone") {
  Tensor a = ops::empty({64});
  Tensor b = ops::empty({64});
  nn::init::normal_(a, kKey, 0, 1);
  nn::init::normal_(b, {kKey.seed, stream_id_for("layer.bias")}, 0, 1);
  CHECK(a.to_vector<float>() != b.to_vector<float>());
  nn::init::normal_(b, kKey, 0, 1);
  CHECK(a.to_vector<float>() == b.to_vector<float>());

  Tensor meta = ops::empty({1 << 20, 1 << 10}, {.device = kMeta});
  const int64_t live = memory_stats(kCPU).live_bytes;
  nn::init::normal_(meta, kKey, 0, 1);
  nn::init::kaiming_uniform_(meta, kKey);
  nn::init::ones_(meta);
  CHECK(memory_stats(kCPU).live_bytes == live);
  CHECK(meta.is_meta());
}

TEST_CASE("init: Parameter overloads fill the parameter's tensor; next_seed follows manual_seed") {
  nn::Parameter parameter(ops::empty({3, 2}));
  nn::init::normal_(parameter, kKey, 0, 1);
  Tensor expected = ops::empty({3, 2});
  nn::init::normal_(expected, kKey, 0, 1);
  CHECK(parameter.tensor().to_vector<float>() == expected.to_vector<float>());
  CHECK(parameter.tensor().requires_grad());  // init does not touch the autograd flag

  manual_seed(5);
  const uint64_t first = nn::init::next_seed();
  const uint64_t second = nn::init::next_seed();
  CHECK(first != second);
  manual_seed(5);
  CHECK(nn::init::next_seed() == first);
}
