// The shared reduction kernel against references computed here: every dtype x
// op over several blocks, rounding once for bf16/f16 (cases where rounding per
// step gives another answer), exact AVG, integer AVG truncation and wrapping,
// NaN in MAX/MIN, aliasing, combine_into + finish_average, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dist/reduction.h"
#include "tensor/element_conversion.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

using namespace tessera;
using namespace tessera::dist;

namespace {

const DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

// A buffer of `dtype` elements, written and read as doubles through the
// tensor layer's conversions (exact for the values the tests use).
struct Buffer {
  DType dtype;
  std::vector<std::byte> bytes;

  Buffer(DType dtype, const std::vector<double>& values)
      : dtype(dtype), bytes(values.size() * element_size(dtype)) {
    for (size_t i = 0; i < values.size(); ++i) set(i, values[i]);
  }
  void set(size_t i, double value) {
    visit_dtype(dtype, [&]<typename T>(T) {
      T element;
      if constexpr (is_narrow_float<T>) {
        element = T(static_cast<float>(value));
      } else {
        element = static_cast<T>(value);
      }
      std::memcpy(bytes.data() + i * sizeof(T), &element, sizeof(T));
    });
  }
  std::vector<double> values() const {
    std::vector<double> out(bytes.size() / element_size(dtype));
    visit_dtype(dtype, [&]<typename T>(T) {
      for (size_t i = 0; i < out.size(); ++i) {
        T element;
        std::memcpy(&element, bytes.data() + i * sizeof(T), sizeof(T));
        if constexpr (is_narrow_float<T>) {
          out[i] = static_cast<double>(static_cast<float>(element));
        } else {
          out[i] = static_cast<double>(element);
        }
      }
    });
    return out;
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

// `value` rounded into `dtype` (through f32 for the 16-bit types).
double round_to(DType dtype, double value) { return Buffer(dtype, {value}).values()[0]; }

// op over small integers (exact sums in every dtype), AVG divided once:
// in the dtype's accumulation type, then rounded into the dtype.
double reference(const std::vector<double>& contributions, ReduceOp op, DType dtype) {
  double sum = 0, max = contributions[0], min = contributions[0];
  for (double value : contributions) {
    sum += value;
    max = std::max(max, value);
    min = std::min(min, value);
  }
  const int n = static_cast<int>(contributions.size());
  switch (op) {
    case ReduceOp::sum: return sum;
    case ReduceOp::max: return max;
    case ReduceOp::min: return min;
    case ReduceOp::avg: break;
  }
  if (dtype == DType::i32 || dtype == DType::i64) return static_cast<double>(static_cast<int64_t>(sum) / n);
  if (dtype == DType::f64) return sum / n;
  return round_to(dtype, static_cast<double>(static_cast<float>(sum) / static_cast<float>(n)));
}

std::vector<const void*> pointers_to(const std::vector<Buffer>& buffers) {
  std::vector<const void*> pointers;
  for (const Buffer& buffer : buffers) pointers.push_back(buffer.data());
  return pointers;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("reduce_in_order: every dtype x op over several blocks matches the reference") {
  const int64_t count = 2500;  // two full blocks of 1024 and a tail
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (int n : {1, 2, 3, 4, 5, 8, 11}) {  // one, two and three sweeps of up to 4 inputs
        CAPTURE(dtype_name(dtype));
        CAPTURE(reduce_op_name(op));
        CAPTURE(n);
        std::vector<Buffer> inputs;
        for (int k = 0; k < n; ++k) {
          std::vector<double> values(count);
          for (int64_t i = 0; i < count; ++i) values[i] = static_cast<double>((k * 7 + i * 3) % 23) - 11;
          inputs.emplace_back(dtype, values);
        }
        Buffer out(dtype, std::vector<double>(count, 0.0));
        reduce_in_order(out.data(), pointers_to(inputs), count, dtype, op, n);
        std::vector<std::vector<double>> input_values;
        for (const Buffer& input : inputs) input_values.push_back(input.values());
        std::vector<double> expected(count);
        for (int64_t i = 0; i < count; ++i) {
          std::vector<double> contributions;
          for (const auto& values : input_values) contributions.push_back(values[i]);
          expected[i] = reference(contributions, op, dtype);
        }
        CHECK(out.values() == expected);
      }
    }
  }
}

TEST_CASE("reduce_in_order: 16-bit sums are accumulated in f32 and rounded once") {
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie that rounds to 1, so
  // rounding after each step loses both small terms; rounding once keeps them.
  const double bf16_step = std::ldexp(1.0, -8);
  std::vector<Buffer> bf16_inputs = {Buffer(DType::bf16, {1.0}), Buffer(DType::bf16, {bf16_step}),
                                     Buffer(DType::bf16, {bf16_step})};
  Buffer bf16_out(DType::bf16, {0.0});
  reduce_in_order(bf16_out.data(), pointers_to(bf16_inputs), 1, DType::bf16, ReduceOp::sum, 3);
  CHECK(round_to(DType::bf16, 1.0 + bf16_step) == 1.0);  // what per-step rounding would give
  CHECK(bf16_out.values()[0] == 1.0 + 2 * bf16_step);

  // f16 keeps 11 significant bits: the same with 2^-11.
  const double f16_step = std::ldexp(1.0, -11);
  std::vector<Buffer> f16_inputs = {Buffer(DType::f16, {1.0}), Buffer(DType::f16, {f16_step}),
                                    Buffer(DType::f16, {f16_step})};
  Buffer f16_out(DType::f16, {0.0});
  reduce_in_order(f16_out.data(), pointers_to(f16_inputs), 1, DType::f16, ReduceOp::sum, 3);
  CHECK(round_to(DType::f16, 1.0 + f16_step) == 1.0);
  CHECK(f16_out.values()[0] == 1.0 + 2 * f16_step);

  // combine_into rounds once per call (the documented pairwise behaviour).
  Buffer pairwise(DType::bf16, {1.0});
  const Buffer step(DType::bf16, {bf16_step});
  combine_into(pairwise.data(), step.data(), 1, DType::bf16, ReduceOp::sum);
  combine_into(pairwise.data(), step.data(), 1, DType::bf16, ReduceOp::sum);
  CHECK(pairwise.values()[0] == 1.0);
}

TEST_CASE("reduce_in_order: AVG sums first and divides once") {
  // f32: the sum in rank order, then one division, rounded once.
  std::vector<Buffer> f32_inputs = {Buffer(DType::f32, {0.1}), Buffer(DType::f32, {0.2}), Buffer(DType::f32, {0.7})};
  Buffer f32_out(DType::f32, {0.0});
  reduce_in_order(f32_out.data(), pointers_to(f32_inputs), 1, DType::f32, ReduceOp::avg, 3);
  const float sum = (0.1f + 0.2f) + 0.7f;
  CHECK(f32_out.values()[0] == static_cast<double>(sum / 3.0f));

  // bf16: (1 + 2^-8 + 2^-8) / 3 in f32, rounded to bf16 once.
  const double step = std::ldexp(1.0, -8);
  std::vector<Buffer> bf16_inputs = {Buffer(DType::bf16, {1.0}), Buffer(DType::bf16, {step}),
                                     Buffer(DType::bf16, {step})};
  Buffer bf16_out(DType::bf16, {0.0});
  reduce_in_order(bf16_out.data(), pointers_to(bf16_inputs), 1, DType::bf16, ReduceOp::avg, 3);
  CHECK(bf16_out.values()[0] == round_to(DType::bf16, static_cast<float>(1.0 + 2 * step) / 3.0f));

  // The divisor is the group size, not the number of inputs passed.
  std::vector<Buffer> two = {Buffer(DType::f64, {3.0}), Buffer(DType::f64, {5.0})};
  Buffer f64_out(DType::f64, {0.0});
  reduce_in_order(f64_out.data(), pointers_to(two), 1, DType::f64, ReduceOp::avg, 4);
  CHECK(f64_out.values()[0] == 2.0);
}

TEST_CASE("reduce_in_order: integer AVG truncates toward zero; sums accumulate in i64 and wrap") {
  // Dividing each contribution first would give 0 + 0 + 0 = 0.
  std::vector<Buffer> ones = {Buffer(DType::i32, {1, 5, -5}), Buffer(DType::i32, {1, 5, -5}),
                              Buffer(DType::i32, {1, 6, -6})};
  Buffer out(DType::i32, {0, 0, 0});
  reduce_in_order(out.data(), pointers_to(ones), 3, DType::i32, ReduceOp::avg, 3);
  CHECK(out.values() == std::vector<double>{1, 5, -5});  // 16 / 3 = 5, -16 / 3 = -5 (not -6)

  // i32 AVG of two maxima: the sum overflows i32 but not the i64 accumulator.
  const double i32_max = std::numeric_limits<int32_t>::max();
  std::vector<Buffer> large = {Buffer(DType::i32, {i32_max}), Buffer(DType::i32, {i32_max})};
  Buffer large_out(DType::i32, {0});
  reduce_in_order(large_out.data(), pointers_to(large), 1, DType::i32, ReduceOp::avg, 2);
  CHECK(large_out.values()[0] == i32_max);

  // i64 sums wrap in two's complement instead of overflowing.
  const int64_t i64_max = std::numeric_limits<int64_t>::max();
  const int64_t inputs[2] = {i64_max, 1};
  const void* pointers[2] = {&inputs[0], &inputs[1]};
  int64_t wrapped = 0;
  reduce_in_order(&wrapped, pointers, 1, DType::i64, ReduceOp::sum, 2);
  CHECK(wrapped == std::numeric_limits<int64_t>::min());
}

TEST_CASE("reduce_in_order: MAX and MIN propagate NaN wherever it is") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float first[3] = {nan, 1.0f, 2.0f};
  const float second[3] = {0.0f, nan, 5.0f};
  const void* pointers[2] = {first, second};
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
    float out[3];
    reduce_in_order(out, pointers, 3, DType::f32, op, 2);
    CHECK(std::isnan(out[0]));
    CHECK(std::isnan(out[1]));
    CHECK(out[2] == (op == ReduceOp::max ? 5.0f : 2.0f));
  }
}

TEST_CASE("reduce_in_order: the output may alias an input") {
  // Six inputs take two sweeps; the output is the fifth input.
  std::vector<std::vector<double>> inputs(6, std::vector<double>(3000));
  std::vector<double> expected(3000, 0.0);
  for (size_t k = 0; k < inputs.size(); ++k) {
    for (size_t i = 0; i < expected.size(); ++i) {
      inputs[k][i] = static_cast<double>(i) * static_cast<double>(k + 1);
      expected[i] += inputs[k][i];
    }
  }
  std::vector<const void*> pointers;
  for (const auto& input : inputs) pointers.push_back(input.data());
  reduce_in_order(inputs[4].data(), pointers, 3000, DType::f64, ReduceOp::sum, 6);
  CHECK(inputs[4] == expected);

  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  const void* two[2] = {a.data(), b.data()};
  reduce_in_order(b.data(), two, 3, DType::f32, ReduceOp::max, 2);
  CHECK(b == std::vector<float>{10, 20, 30});
  reduce_in_order(a.data(), two, 3, DType::f32, ReduceOp::sum, 2);
  CHECK(a == std::vector<float>{11, 22, 33});
}

TEST_CASE("combine_into and finish_average: pairwise steps with one division at the end") {
  for (DType dtype : kDTypes) {
    CAPTURE(dtype_name(dtype));
    Buffer acc(dtype, {7, -7, 2});
    const Buffer other(dtype, {1, -2, 3});
    combine_into(acc.data(), other.data(), 3, dtype, ReduceOp::avg);  // AVG combines as SUM
    CHECK(acc.values() == std::vector<double>{8, -9, 5});
    finish_average(acc.data(), 3, dtype, 2);
    const bool integral = dtype == DType::i32 || dtype == DType::i64;
    CHECK(acc.values() == std::vector<double>{4, integral ? -4 : -4.5, integral ? 2 : 2.5});

    Buffer biggest(dtype, {7, -7, 2});
    combine_into(biggest.data(), other.data(), 3, dtype, ReduceOp::max);
    CHECK(biggest.values() == std::vector<double>{7, -2, 3});
    Buffer smallest(dtype, {7, -7, 2});
    combine_into(smallest.data(), other.data(), 3, dtype, ReduceOp::min);
    CHECK(smallest.values() == std::vector<double>{1, -7, 2});
  }
  // finish_average rounds once into the dtype: 1/3 in f32, then to bf16.
  Buffer third(DType::bf16, {1.0});
  finish_average(third.data(), 1, DType::bf16, 3);
  CHECK(third.values()[0] == round_to(DType::bf16, 1.0f / 3.0f));
}

TEST_CASE("reduce_in_order, combine_into, finish_average: errors name what is wrong") {
  const bool values[2] = {true, false};
  const void* pointers[1] = {values};
  bool out[2];
  CHECK(error_of([&] { reduce_in_order(out, pointers, 2, DType::boolean, ReduceOp::sum, 1); }) ==
        "reduce_in_order: cannot reduce dtype bool (f32, f64, bf16, f16, i32 and i64 can be reduced)");
  CHECK(error_of([&] { combine_into(out, values, 2, DType::boolean, ReduceOp::max); }) ==
        "combine_into: cannot reduce dtype bool (f32, f64, bf16, f16, i32 and i64 can be reduced)");
  CHECK(error_of([&] { finish_average(out, 2, DType::boolean, 2); }) ==
        "finish_average: cannot reduce dtype bool (f32, f64, bf16, f16, i32 and i64 can be reduced)");

  float data[1] = {1.0f};
  const void* f32_pointers[1] = {data};
  CHECK(error_of([&] { reduce_in_order(data, {}, 1, DType::f32, ReduceOp::sum, 1); }) ==
        "reduce_in_order: needs at least one input, got none");
  CHECK(error_of([&] { reduce_in_order(data, f32_pointers, -1, DType::f32, ReduceOp::sum, 1); }) ==
        "reduce_in_order: count must be non-negative, got -1");
  CHECK(error_of([&] { reduce_in_order(data, f32_pointers, 1, DType::f32, ReduceOp::avg, 0); }) ==
        "reduce_in_order: AVG needs a group size >= 1, got 0");
  CHECK(error_of([&] { finish_average(data, 1, DType::f32, 0); }) ==
        "finish_average: group size must be >= 1, got 0");
  CHECK(error_of([&] { combine_into(data, data, -3, DType::f32, ReduceOp::sum); }) ==
        "combine_into: count must be non-negative, got -3");
}
