// The vectorised f32 maths (tensor/cpu/vector_math.h) and the activations
// built on it: within the documented ulp bound of std:: over a million floats
// spread over every binade plus the ranges where each formula switches; the
// IEEE special values, through the public ops in f32, f64 and bf16; and the
// same bits on every instruction set with FMA (a digest that the AVX-512 and
// the AVX2 builds of .ci/run must both reproduce).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tensor/cpu/ulp.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/ops.h"

using namespace tessera;
using tessera::cpu::map_vectors;
namespace vec = tessera::cpu::vec;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float float_of_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Every 4099th bit pattern (all signs and binades, subnormals, infinities and
// NaNs), plus 20001 points across each [low, high] where a formula changes.
std::vector<float> sweep(std::initializer_list<std::pair<float, float>> dense_ranges) {
  std::vector<float> values;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) values.push_back(float_of_bits(static_cast<uint32_t>(bits)));
  for (const auto& [low, high] : dense_ranges) {
    for (int i = 0; i <= 20000; ++i) values.push_back(low + (high - low) * static_cast<float>(i) / 20000.0f);
  }
  return values;
}

struct VectorFunction {
  const char* name;
  std::function<void(float*, const float*, int64_t)> run;
  double (*exact)(double);
  double bound_ulp;  // the bound vector_math.h documents
  std::vector<float> inputs;
};

std::vector<VectorFunction> vector_functions() {
  return {
      {"exp", [](float* y, const float* x, int64_t n) { map_vectors(y, x, n, [](auto v) { return vec::exp(v); }); },
       [](double x) { return std::exp(x); }, 1.0,
       sweep({{-104.0f, -86.0f}, {-0.5f, 0.5f}, {86.0f, 89.0f}})},
      {"log", [](float* y, const float* x, int64_t n) { map_vectors(y, x, n, [](auto v) { return vec::log(v); }); },
       [](double x) { return std::log(x); }, 1.0, sweep({{0.5f, 2.0f}, {1e-45f, 1e-37f}})},
      {"tanh", [](float* y, const float* x, int64_t n) { map_vectors(y, x, n, [](auto v) { return vec::tanh(v); }); },
       [](double x) { return std::tanh(x); }, 1.5, sweep({{-1.0f, 1.0f}, {8.0f, 10.0f}})},
      {"erf", [](float* y, const float* x, int64_t n) { map_vectors(y, x, n, [](auto v) { return vec::erf(v); }); },
       [](double x) { return std::erf(x); }, 1.5, sweep({{-1.5f, 1.5f}, {3.5f, 4.5f}})},
      {"sigmoid",
       [](float* y, const float* x, int64_t n) { map_vectors(y, x, n, [](auto v) { return vec::sigmoid(v); }); },
       [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, 1.5, sweep({{-110.0f, -80.0f}, {-2.0f, 2.0f}})},
  };
}

}  // namespace

TEST_CASE("vector maths: within the documented ulp bound of std::, special values included") {
  for (const VectorFunction& function : vector_functions()) {
    CAPTURE(function.name);
    const auto n = static_cast<int64_t>(function.inputs.size());
    std::vector<float> results(function.inputs.size());
    function.run(results.data(), function.inputs.data(), n);
    double worst = 0.0;
    float worst_input = 0.0f;
    int64_t special_mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = function.inputs[i];
      const double exact = function.exact(x);
      if (cpu::special_value_differs(results[i], exact)) {
        if (++special_mismatches <= 3) FAIL_CHECK("x = " << x << ": " << results[i] << ", std:: " << exact);
        continue;
      }
      const double error = cpu::ulp_error(results[i], exact);
      if (error > worst) worst = error, worst_input = x;
    }
    INFO("largest error " << worst << " ulp at x = " << worst_input);
    CHECK(special_mismatches == 0);
    CHECK(worst <= function.bound_ulp);
    CHECK(worst > 0.0);  // the sweep reaches inputs that round
  }
}

TEST_CASE("vector maths: the IEEE special values through ops in f32, f64 and bf16") {
  // {input, expected}: every entry holds in every dtype (bf16 represents
  // them all), the sign of a zero included.
  struct Case {
    float x, expected;
  };
  constexpr float kHuge = 0x1p100f;  // x^3 overflows f32, not f64
  const std::vector<std::pair<const char*, std::vector<Case>>> table = {
      {"exp", {{-kInf, 0.0f}, {kInf, kInf}, {kNaN, kNaN}, {0.0f, 1.0f}, {-0.0f, 1.0f}, {-1000.0f, 0.0f}, {1000.0f, kInf}}},
      {"log", {{0.0f, -kInf}, {-0.0f, -kInf}, {-1.0f, kNaN}, {-kInf, kNaN}, {kInf, kInf}, {kNaN, kNaN}, {1.0f, 0.0f}}},
      {"tanh", {{0.0f, 0.0f}, {-0.0f, -0.0f}, {kInf, 1.0f}, {-kInf, -1.0f}, {kNaN, kNaN}, {-30.0f, -1.0f}}},
      {"sigmoid", {{-kInf, 0.0f}, {kInf, 1.0f}, {kNaN, kNaN}, {0.0f, 0.5f}, {-1000.0f, 0.0f}, {1000.0f, 1.0f}}},
      // Activations at -inf are their limit -0, not -inf * 0 = NaN.
      {"silu", {{-kInf, -0.0f}, {kInf, kInf}, {kNaN, kNaN}, {-0.0f, -0.0f}, {-kHuge, -0.0f}, {kHuge, kHuge}}},
      {"gelu_tanh", {{-kInf, -0.0f}, {kInf, kInf}, {kNaN, kNaN}, {-0.0f, -0.0f}, {-kHuge, -0.0f}, {kHuge, kHuge}}},
      {"gelu_erf", {{-kInf, -0.0f}, {kInf, kInf}, {kNaN, kNaN}, {-0.0f, -0.0f}, {-kHuge, -0.0f}, {kHuge, kHuge}}},
      // Derivatives at the infinities are their limits (silu' reaches 0 from below).
      {"silu'", {{-kInf, -0.0f}, {kInf, 1.0f}, {kNaN, kNaN}, {-kHuge, -0.0f}, {kHuge, 1.0f}}},
      {"gelu_tanh'", {{-kInf, 0.0f}, {kInf, 1.0f}, {kNaN, kNaN}, {-kHuge, 0.0f}, {kHuge, 1.0f}}},
      {"gelu_erf'", {{-kInf, 0.0f}, {kInf, 1.0f}, {kNaN, kNaN}, {-kHuge, 0.0f}, {kHuge, 1.0f}}},
      {"sqrt", {{-0.0f, -0.0f}, {kInf, kInf}, {-1.0f, kNaN}, {kNaN, kNaN}}},
      {"rsqrt", {{0.0f, kInf}, {-0.0f, -kInf}, {kInf, 0.0f}, {-1.0f, kNaN}}},
  };
  const std::map<std::string, std::function<Tensor(const Tensor&)>> ops_by_name = {
      {"exp", [](const Tensor& t) { return ops::exp(t); }},
      {"log", [](const Tensor& t) { return ops::log(t); }},
      {"tanh", [](const Tensor& t) { return ops::tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return ops::sigmoid(t); }},
      {"silu", [](const Tensor& t) { return ops::silu(t); }},
      {"gelu_tanh", [](const Tensor& t) { return ops::gelu(t, GeluApproximation::tanh); }},
      {"gelu_erf", [](const Tensor& t) { return ops::gelu(t, GeluApproximation::none); }},
      {"silu'", [](const Tensor& t) { return ops::silu_backward(ops::ones_like(t), t); }},
      {"gelu_tanh'", [](const Tensor& t) { return ops::gelu_backward(ops::ones_like(t), t, GeluApproximation::tanh); }},
      {"gelu_erf'", [](const Tensor& t) { return ops::gelu_backward(ops::ones_like(t), t, GeluApproximation::none); }},
      {"sqrt", [](const Tensor& t) { return ops::sqrt(t); }},
      {"rsqrt", [](const Tensor& t) { return ops::rsqrt(t); }},
  };
  for (const auto& [name, cases] : table) {
    CAPTURE(name);
    std::vector<float> inputs;
    for (const Case& c : cases) inputs.push_back(c.x);
    const Tensor x = ops::from_vector(inputs, {static_cast<int64_t>(inputs.size())});
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      CAPTURE(dtype_name(dtype));
      const std::vector<double> got = ops_by_name.at(name)(ops::to(x, dtype)).to_vector<double>();
      for (size_t i = 0; i < cases.size(); ++i) {
        CAPTURE(cases[i].x);
        if (std::isnan(cases[i].expected)) {
          CHECK(std::isnan(got[i]));
        } else {
          CHECK(got[i] == cases[i].expected);
          CHECK(std::signbit(got[i]) == std::signbit(cases[i].expected));
        }
      }
    }
  }
}

TEST_CASE("vector maths: subnormals, overflow and underflow thresholds as std::") {
  const float smallest = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {-103.0f, -95.0f, -87.5f, 88.72f, 88.73f, smallest, -smallest, 1e-40f};
  const std::vector<float> e = ops::exp(ops::from_vector(x, {8})).to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i]);
    CHECK(cpu::ulp_error(e[i], std::exp(static_cast<double>(x[i]))) <= 1.0);
  }
  CHECK(e[0] > 0.0f);
  CHECK(std::fpclassify(e[0]) == FP_SUBNORMAL);  // exp(-103) = 1.4e-45 * 1.03
  CHECK(std::isfinite(e[3]));
  CHECK(e[4] == kInf);
  CHECK(e[5] == 1.0f);

  const std::vector<float> positive = {smallest, 1e-40f, std::numeric_limits<float>::min(),
                                       std::numeric_limits<float>::max()};
  const std::vector<float> l = ops::log(ops::from_vector(positive, {4})).to_vector<float>();
  for (size_t i = 0; i < positive.size(); ++i) {
    CAPTURE(positive[i]);
    CHECK(cpu::ulp_error(l[i], std::log(static_cast<double>(positive[i]))) <= 1.0);
  }
  // Odd functions keep a subnormal input (tanh) or scale it by 2/sqrt(pi) (erf).
  const std::vector<float> t = ops::tanh(ops::from_vector(std::vector<float>{-1e-40f}, {1})).to_vector<float>();
  CHECK(t[0] == -1e-40f);
  float erf_of_subnormal = 0.0f;
  map_vectors(&erf_of_subnormal, &x[6], 1, [](auto v) { return vec::erf(v); });
  CHECK(cpu::ulp_error(erf_of_subnormal, std::erf(static_cast<double>(x[6]))) <= 1.0);
  // sigmoid's tiny results are subnormal, not flushed.
  const std::vector<float> s = ops::sigmoid(ops::from_vector(std::vector<float>{-100.0f}, {1})).to_vector<float>();
  CHECK(std::fpclassify(s[0]) == FP_SUBNORMAL);
  CHECK(cpu::ulp_error(s[0], std::exp(-100.0)) <= 1.5);
}

TEST_CASE("vector maths: softmax, log_softmax and cross-entropy keep -inf entries exact") {
  const Tensor row = ops::from_vector(std::vector<float>{0.0f, -kInf, 0.0f, -kInf}, {1, 4});
  CHECK(ops::softmax(row, -1).to_vector<float>() == std::vector<float>{0.5f, 0.0f, 0.5f, 0.0f});
  const std::vector<float> log_probs = ops::log_softmax(row, -1).to_vector<float>();
  CHECK(log_probs[0] == doctest::Approx(-std::log(2.0)).epsilon(1e-7));
  CHECK(log_probs[1] == -kInf);
  CHECK(ops::cross_entropy(row, ops::from_vector(std::vector<int64_t>{2}, {1})).item() ==
        doctest::Approx(std::log(2.0)).epsilon(1e-7));
}

#if defined(__FMA__)
TEST_CASE("vector maths: the same bits on every instruction set with FMA") {
  // FNV-1a over the bits of every function on the sweep of the accuracy test,
  // and of the activations built on them. Each is made of IEEE operations
  // only, so AVX2 and AVX-512 (8 or 16 lanes, same operations per lane) must
  // agree to the bit; .ci/run runs this in both builds. If you change
  // vector_math.h or the activations, put the digest the failure prints here.
  constexpr uint64_t kExpectedDigest = 0xba7e4a8db8f61365ull;
  uint64_t digest = 14695981039346656037ull;
  const auto absorb = [&](const std::vector<float>& values) {
    for (float value : values) {
      digest ^= std::isnan(value) ? 0x7fc00000u : float_bits(value);  // which NaN the hardware propagates varies
      digest *= 1099511628211ull;
    }
  };
  const std::vector<float> inputs = sweep({{-10.0f, 10.0f}});
  for (const VectorFunction& function : vector_functions()) {
    std::vector<float> results(inputs.size());
    function.run(results.data(), inputs.data(), static_cast<int64_t>(inputs.size()));
    absorb(results);
  }
  const Tensor x = ops::from_vector(inputs, {static_cast<int64_t>(inputs.size())});
  const Tensor ones = ops::ones_like(x);
  for (auto approximation : {GeluApproximation::tanh, GeluApproximation::none}) {
    absorb(ops::gelu(x, approximation).to_vector<float>());
    absorb(ops::gelu_backward(ones, x, approximation).to_vector<float>());
  }
  absorb(ops::silu(x).to_vector<float>());
  absorb(ops::silu_backward(ones, x).to_vector<float>());
  INFO(fmt::format("digest {:#018x} on {}", digest, cpu::FloatVector::kInstructionSet));
  CHECK(digest == kExpectedDigest);
}
#else
TEST_CASE("vector maths: the same bits on every instruction set with FMA") {
  MESSAGE("skipped: this build targets no FMA (-march), whose results differ from FMA builds by design");
}
#endif
