// NF4 packing (tensor/nf4_format.h, ops::nf4_quantize / nf4_dequantize),
// checked against a decoder written here from the layout's description: the
// codes are the nearest NF4 values (brute force), the scales the double
// quantisation's, the error within NF4's bound, and rows independent of each
// other (what lets FSDP shard the packed weight by rows).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/nf4_format.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

// QLoRA's table, typed in again: the header's must equal it.
constexpr std::array<double, 16> kNormalFloat4 = {
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};

float read_f32(const uint8_t* bytes) {
  uint32_t word = 0;
  for (int i = 3; i >= 0; --i) word = (word << 8) | bytes[i];
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// One packed row, parsed by offsets computed here (not by RowLayout).
struct ParsedRow {
  std::vector<uint8_t> codes;  // one per element
  std::vector<float> scales;   // one per block, dequantised
};

ParsedRow parse_row(const uint8_t* row, int64_t in) {
  const int64_t blocks = (in + 63) / 64;
  const int64_t groups = (blocks + 255) / 256;
  const float mean = read_f32(row + 33 * blocks + 4 * groups);
  ParsedRow parsed;
  for (int64_t b = 0; b < blocks; ++b) {
    const auto code = static_cast<int8_t>(row[32 * blocks + b]);
    const float step = read_f32(row + 33 * blocks + 4 * (b / 256));
    parsed.scales.push_back(std::fma(static_cast<float>(code), step, mean));
  }
  for (int64_t j = 0; j < in; ++j) {
    const uint8_t byte = row[32 * (j / 64) + (j % 64) / 2];
    parsed.codes.push_back(j % 2 == 0 ? byte >> 4 : byte & 0xf);
  }
  return parsed;
}

// The first of the values nearest to x.
uint8_t brute_force_nearest(double x) {
  uint8_t best = 0;
  for (uint8_t code = 1; code < 16; ++code) {
    if (std::fabs(x - kNormalFloat4[code]) < std::fabs(x - kNormalFloat4[best])) best = code;
  }
  return best;
}

std::vector<float> values_of(const Tensor& tensor) { return tensor.to_vector<float>(); }

// Weights with the spreads QLoRA meets: normal rows of different scales, an
// outlier, a zero block and a constant row.
Tensor test_weights(int64_t rows, int64_t in) {
  Tensor weights = ops::randn({rows, in}, PhiloxKey{20261130, 4});
  std::vector<float> values = values_of(weights);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < in; ++j) values[static_cast<size_t>(r * in + j)] *= 0.02f * static_cast<float>(r + 1);
  }
  values[3] = 0.9f;  // an outlier in block 0 of row 0
  if (in > 128) {
    for (int64_t j = 64; j < 128; ++j) values[static_cast<size_t>(in + j)] = 0.0f;  // a zero block in row 1
  }
  if (rows > 2) {
    for (int64_t j = 0; j < in; ++j) values[static_cast<size_t>(2 * in + j)] = -0.25f;  // a constant row
  }
  return ops::from_vector(std::vector<double>(values.begin(), values.end()), {rows, in});
}

}  // namespace

TEST_CASE("nf4: the table is QLoRA's, codes round to the nearest value, ties to the lower") {
  for (uint8_t code = 0; code < 16; ++code) {
    CAPTURE(int{code});
    CHECK(nf4::value(code) == static_cast<float>(kNormalFloat4[code]));
    CHECK(nf4::nearest_code(nf4::value(code)) == code);
    if (code > 0) {
      const double midpoint = (kNormalFloat4[code - 1] + kNormalFloat4[code]) / 2.0;
      const auto below = static_cast<float>(midpoint);
      // An f32 at or below the exact midpoint goes down, one above it goes up.
      const float at_or_below = static_cast<double>(below) <= midpoint ? below : std::nextafter(below, -2.0f);
      CHECK(nf4::nearest_code(at_or_below) == code - 1);
      CHECK(nf4::nearest_code(std::nextafter(at_or_below, 2.0f)) == code);
    }
  }
  CHECK(nf4::nearest_code(-7.0f) == 0);
  CHECK(nf4::nearest_code(3.0f) == 15);
}

TEST_CASE("nf4: the row layout, 0.518 bytes a weight at 4096 wide") {
  CHECK(ops::nf4_row_bytes(4096) == 2120);  // 64 blocks: 2048 code bytes, 64 scale codes, 1 step, the mean
  CHECK(ops::nf4_row_bytes(64) == 32 + 1 + 4 + 4);
  CHECK(ops::nf4_row_bytes(65) == 64 + 2 + 4 + 4);
  CHECK(ops::nf4_row_bytes(64 * 257) == 257 * 33 + 2 * 4 + 4);  // two scale groups
  CHECK(static_cast<double>(ops::nf4_row_bytes(4096)) / 4096.0 == doctest::Approx(0.5176).epsilon(1e-3));
}

TEST_CASE("nf4: every code is the nearest value to weight / stored scale, and the error is within NF4's bound") {
  for (const auto& [rows, in] : std::vector<std::pair<int64_t, int64_t>>{{3, 200}, {4, 64}, {2, 64 * 300 + 5}}) {
    CAPTURE(rows);
    CAPTURE(in);
    const Tensor weights = test_weights(rows, in);
    const Tensor packed = ops::nf4_quantize(weights);
    REQUIRE(packed.dtype() == DType::u8);
    REQUIRE(packed.sizes() == Shape{rows, ops::nf4_row_bytes(in)});
    const std::vector<float> original = values_of(weights);
    const std::vector<float> restored = values_of(ops::nf4_dequantize(packed, in, DType::f32));
    const auto* bytes = static_cast<const uint8_t*>(packed.raw_data());
    int64_t mismatched_codes = 0, out_of_bound = 0, wrong_values = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const ParsedRow row = parse_row(bytes + r * packed.size(1), in);
      // The scales' own bound: a step of at most spread / 127 between codes.
      double mean = 0.0;
      std::vector<double> absmax(row.scales.size(), 0.0);
      for (int64_t j = 0; j < in; ++j) {
        const auto i = static_cast<size_t>(r * in + j);
        double& block_max = absmax[static_cast<size_t>(j / 64)];
        block_max = std::max(block_max, std::fabs(double{original[i]}));
      }
      double spread = 0.0;
      for (const double scale : absmax) mean += scale / static_cast<double>(absmax.size());
      for (const double scale : absmax) spread = std::max(spread, std::fabs(scale - mean));
      for (int64_t j = 0; j < in; ++j) {
        const auto i = static_cast<size_t>(r * in + j);
        const float scale = row.scales[static_cast<size_t>(j / 64)];
        const uint8_t expected = scale > 0.0f ? brute_force_nearest(double{original[i] / scale}) : 7;
        mismatched_codes += row.codes[static_cast<size_t>(j)] != expected;
        wrong_values += restored[i] != static_cast<float>(kNormalFloat4[row.codes[static_cast<size_t>(j)]]) * scale;
        const double block_absmax = absmax[static_cast<size_t>(j / 64)];
        const double scale_error = spread / 254.0 * (1.0 + 1e-5) + 1e-7 * block_absmax;
        const double bound = nf4::kMaxHalfGap * (block_absmax + scale_error) + scale_error + 1e-7 * block_absmax;
        out_of_bound += std::fabs(double{original[i]} - restored[i]) > bound;
      }
    }
    CHECK(mismatched_codes == 0);
    CHECK(wrong_values == 0);
    CHECK(out_of_bound == 0);
    // Exact where NF4 is exact: zeros, and a constant row's -absmax.
    if (in > 128) {
      for (int64_t j = 64; j < 128; ++j) CHECK(restored[static_cast<size_t>(in + j)] == 0.0f);
    }
    if (rows > 2) {
      double worst = 0.0;
      for (int64_t j = 0; j < in; ++j) {
        worst = std::max(worst, std::fabs(restored[static_cast<size_t>(2 * in + j)] + 0.25));
      }
      CHECK(worst <= 0.25 * 1e-6);
    }
  }
}

TEST_CASE("nf4: a row's bytes depend on that row alone: quantising a shard gives the shard of the quantised whole") {
  const int64_t rows = 7, in = 200;
  const Tensor weights = test_weights(rows, in);
  const Tensor whole = ops::nf4_quantize(weights);
  for (const int64_t shards : {2, 3}) {
    int64_t first = 0;
    for (int64_t shard = 0; shard < shards; ++shard) {
      const int64_t count = std::min((rows + shards - 1) / shards, rows - first);
      const Tensor piece = ops::nf4_quantize(ops::narrow(weights, 0, first, count));
      CHECK(piece.to_vector<int64_t>() == ops::narrow(whole, 0, first, count).to_vector<int64_t>());
      first += count;
    }
  }
}

TEST_CASE("nf4: dequantised into bf16, f16 and f64 is the f32 value rounded once") {
  const Tensor packed = ops::nf4_quantize(test_weights(3, 130));
  const Tensor in_f32 = ops::nf4_dequantize(packed, 130, DType::f32);
  for (const DType dtype : {DType::bf16, DType::f16, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor direct = ops::nf4_dequantize(packed, 130, dtype);
    CHECK(direct.dtype() == dtype);
    CHECK(direct.to_vector<double>() == ops::to(in_f32, dtype).to_vector<double>());
  }
  CHECK(ops::nf4_dequantize(ops::nf4_quantize(ops::empty({5, 70}, {.device = kMeta})), 70, DType::bf16).sizes() ==
        Shape{5, 70});
}

TEST_CASE("nf4: bad input is refused, naming what is wrong") {
  Tensor weights = ops::zeros({2, 64});
  std::vector<double> with_nan(128, 0.5);
  with_nan[70] = std::nan("");
  CHECK_THROWS_WITH_AS(ops::nf4_quantize(ops::from_vector(with_nan, {2, 64})),
                       doctest::Contains("element [1, 6] of the [2, 64] weight is nan"), Error);
  CHECK_THROWS_WITH_AS(ops::nf4_quantize(ops::zeros({64})), doctest::Contains("a floating matrix"), Error);
  CHECK_THROWS_WITH_AS(ops::nf4_quantize(ops::zeros({2, 4}, {.dtype = DType::i32})),
                       doctest::Contains("a floating matrix"), Error);
  const Tensor packed = ops::nf4_quantize(weights);
  CHECK_THROWS_WITH_AS(ops::nf4_dequantize(packed, 65, DType::f32),
                       doctest::Contains("rows of 65 elements pack into 74 bytes, but the packed rows have 41"), Error);
  CHECK_THROWS_WITH_AS(ops::nf4_dequantize(packed, 64, DType::i32), doctest::Contains("into f32, f64, bf16 or f16"),
                       Error);
  CHECK_THROWS_WITH_AS(ops::nf4_dequantize(weights, 64, DType::f32), doctest::Contains("needs packed NF4 rows"),
                       Error);
}
