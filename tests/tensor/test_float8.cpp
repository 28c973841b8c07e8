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

#include "tensor/float8_bits.h"

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
  check_format("e4m3", float8_bits::kE4M3);
  check_format("e5m2", float8_bits::kE5M2);
  CHECK(float8_bits::float_from_code(0x7e, float8_bits::kE4M3) == 448.0f);
  CHECK(float8_bits::float_from_code(0x7b, float8_bits::kE5M2) == 57344.0f);
  CHECK(float8_bits::float_from_code(0x01, float8_bits::kE4M3) == std::ldexp(1.0f, -9));
  CHECK(float8_bits::float_from_code(0x01, float8_bits::kE5M2) == std::ldexp(1.0f, -16));
}
