// The float8 conversions (tensor/float8_bits.h) against ml_dtypes' tables
// (tests/oracle/float8_oracle.py): all 256 codes of e4m3 and e5m2 decoded,
// and every code's value, the ties between neighbours and the f32 values one
// ulp either side encoded, with the hardware's saturation past the largest
// finite value; NaN and infinities by hand.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/float8_bits.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

const nlohmann::json& float8_tables() {
  static const nlohmann::json tables =
      nlohmann::json::parse(std::ifstream(std::string(TESSERA_TENSOR_GOLDEN_DIR) + "/float8_tables.json"));
  return tables;
}

void check_format(const char* name, const float8_bits::Format& format) {
  CAPTURE(name);
  const nlohmann::json& table = float8_tables().at(name);
  REQUIRE(table.at("decode").size() == 256);
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    CAPTURE(code);
    const float decoded = float8_bits::float_from_code(static_cast<uint8_t>(code), format);
    const nlohmann::json& expected = table.at("decode")[static_cast<size_t>(code)];
    if (expected.is_string()) {
      CHECK(std::isnan(decoded));
      ++nans;
    } else {
      CHECK(float16_bits::bits_of(decoded) == expected.get<uint32_t>());
    }
  }
  CHECK(nans == (format.has_infinity ? 6 : 2));
  int64_t encodings = 0;
  for (const nlohmann::json& pair : table.at("encode")) {
    const auto bits = pair[0].get<uint32_t>();
    CAPTURE(float16_bits::float_of(bits));
    CHECK(static_cast<int>(float8_bits::code_from_float(float16_bits::float_of(bits), format)) == pair[1].get<int>());
    ++encodings;
  }
  CHECK(encodings > 900);
  // Saturation and NaN as the hardware's satfinite conversion gives them.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float8_bits::code_from_float(inf, format) == format.max_finite_code);
  CHECK(float8_bits::code_from_float(-inf, format) == (0x80u | format.max_finite_code));
  CHECK(float8_bits::code_from_float(std::numeric_limits<float>::quiet_NaN(), format) == 0x7f);
  CHECK(float8_bits::code_from_float(-std::numeric_limits<float>::quiet_NaN(), format) == 0x7f);
  CHECK(std::isnan(float8_bits::float_from_code(0x7f, format)));
  CHECK(float8_bits::code_from_float(std::numeric_limits<float>::denorm_min(), format) == 0);
  CHECK(float8_bits::code_from_float(-0.0f, format) == 0x80);
}

}  // namespace

TEST_CASE("float8 e4m3 and e5m2: all 256 codes and the rounding boundaries against ml_dtypes; satfinite saturation") {
  check_format("e4m3", float8_bits::e4m3());
  check_format("e5m2", float8_bits::e5m2());
  CHECK(float8_bits::float_from_code(0x7e, float8_bits::e4m3()) == 448.0f);
  CHECK(float8_bits::float_from_code(0x7b, float8_bits::e5m2()) == 57344.0f);
  CHECK(float8_bits::float_from_code(0x01, float8_bits::e4m3()) == std::ldexp(1.0f, -9));
  CHECK(float8_bits::float_from_code(0x01, float8_bits::e5m2()) == std::ldexp(1.0f, -16));
}

TEST_CASE("f8e4m3 and f8e5m2 tensors: every finite code survives a cast round trip; ops compute in f32, round back") {
  for (const auto& [name, dtype, format] : {std::tuple{"e4m3", DType::f8e4m3, float8_bits::e4m3()},
                                            std::tuple{"e5m2", DType::f8e5m2, float8_bits::e5m2()}}) {
    CAPTURE(name);
    std::vector<float> values;
    std::vector<uint8_t> codes;
    for (int code = 0; code < 256; ++code) {
      const float value = float8_bits::float_from_code(static_cast<uint8_t>(code), format);
      if (!std::isfinite(value)) continue;
      values.push_back(value);
      codes.push_back(static_cast<uint8_t>(code));
    }
    const Tensor narrow = ops::to(ops::from_vector(values, {static_cast<int64_t>(values.size())}), dtype);
    CHECK(narrow.dtype() == dtype);
    CHECK(element_size(dtype) == 1);
    CHECK(ops::as_bytes(narrow).to_vector<uint8_t>() == codes);
    CHECK(ops::to(narrow, DType::f32).to_vector<float>() == values);
    // a + b: in f32, then one rounding into the format (saturating).
    const Tensor sum = ops::add(narrow, narrow);
    CHECK(sum.dtype() == dtype);
    std::vector<uint8_t> expected;
    for (const float value : values) expected.push_back(float8_bits::code_from_float(value + value, format));
    CHECK(ops::as_bytes(sum).to_vector<uint8_t>() == expected);
    CHECK_THROWS_WITH_AS(ops::rand({4}, {.dtype = dtype}), doctest::Contains("too few values for random draws"),
                         Error);
  }
  CHECK(promote_types(DType::f8e4m3, DType::f8e5m2) == DType::bf16);
  CHECK(promote_types(DType::f8e4m3, DType::bf16) == DType::bf16);
  CHECK(promote_types(DType::f8e5m2, DType::f32) == DType::f32);
  CHECK(promote_types(DType::f8e4m3, DType::i64) == DType::f8e4m3);
  CHECK(dtype_from_name("f8e4m3") == DType::f8e4m3);
  CHECK(is_floating(DType::f8e5m2));
  CHECK(compute_dtype(DType::f8e5m2) == DType::f32);
}
