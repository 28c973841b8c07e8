// bench/vector_math: the accuracy and speed of tessera's vectorised f32 exp,
// log, tanh, erf and sigmoid (tensor/cpu/vector_math.h).
// Accuracy: every float (or every --stride-th bit pattern) through the vector
// code against std:: in double, which is exact far below f32's precision: the
// largest error in ulp and the input where it occurs, and how many special
// values (NaN, inf, the sign of zero) differ from std::. Speed: ns per element
// on one thread through the vector code, through Eigen's packet functions
// (what tessera used before: fast, but ISA-dependent at the edges) and
// through std:: in f32.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <unsupported/Eigen/SpecialFunctions>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/machine_context.h"
#include "tensor/cpu/ulp.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/parallel.h"

namespace {

using tessera::cpu::FloatVector;
using tessera::cpu::map_vectors;
namespace vec = tessera::cpu::vec;

using Kernel = std::function<void(float*, const float*, int64_t)>;
using Packet = FloatVector::Packet;

struct Function {
  const char* name;
  Kernel vectorised;
  double (*exact)(double);
  float (*scalar)(float);  // std:: in f32, a speed reference
  Packet (*eigen)(const Packet&);  // Eigen's packet version, another
};

// GCC 12's AVX-512 intrinsics read "undefined" registers that -Wuninitialized
// reports from inside Eigen's packet maths (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"

// Eigen's packet function over n floats (n a multiple of the width).
Kernel eigen_kernel(Packet (*function)(const Packet&)) {
  return [function](float* out, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; i += FloatVector::kWidth) {
      Eigen::internal::pstoreu(out + i, function(Eigen::internal::ploadu<Packet>(x + i)));
    }
  };
}

std::vector<Function> functions() {
  return {
      {"exp", [](float* out, const float* x, int64_t n) { map_vectors(out, x, n, [](auto v) { return vec::exp(v); }); },
       [](double x) { return std::exp(x); }, [](float x) { return std::exp(x); },
       [](const Packet& x) { return Eigen::internal::pexp(x); }},
      {"log", [](float* out, const float* x, int64_t n) { map_vectors(out, x, n, [](auto v) { return vec::log(v); }); },
       [](double x) { return std::log(x); }, [](float x) { return std::log(x); },
       [](const Packet& x) { return Eigen::internal::plog(x); }},
      {"tanh", [](float* out, const float* x, int64_t n) { map_vectors(out, x, n, [](auto v) { return vec::tanh(v); }); },
       [](double x) { return std::tanh(x); }, [](float x) { return std::tanh(x); },
       [](const Packet& x) { return Eigen::internal::ptanh(x); }},
      {"erf", [](float* out, const float* x, int64_t n) { map_vectors(out, x, n, [](auto v) { return vec::erf(v); }); },
       [](double x) { return std::erf(x); }, [](float x) { return std::erf(x); },
       [](const Packet& x) { return Eigen::internal::perf(x); }},
      {"sigmoid",
       [](float* out, const float* x, int64_t n) { map_vectors(out, x, n, [](auto v) { return vec::sigmoid(v); }); },
       [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, [](float x) { return 1.0f / (1.0f + std::exp(-x)); },
       [](const Packet& x) { return Eigen::internal::scalar_logistic_op<float>().packetOp(x); }},
  };
}

struct Accuracy {
  double worst_ulp = 0.0;
  float worst_input = 0.0f;
  int64_t special_mismatches = 0;
  float first_mismatch = 0.0f;
  int64_t checked = 0;

  void merge(const Accuracy& other) {
    if (other.worst_ulp > worst_ulp) worst_ulp = other.worst_ulp, worst_input = other.worst_input;
    if (special_mismatches == 0 && other.special_mismatches > 0) first_mismatch = other.first_mismatch;
    special_mismatches += other.special_mismatches;
    checked += other.checked;
  }
};

float float_of_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

Accuracy measure(const Function& function, uint64_t stride) {
  constexpr int64_t kBlock = 1 << 16;
  const uint64_t count = ((uint64_t{1} << 32) + stride - 1) / stride;
  const auto blocks = static_cast<int64_t>((count + kBlock - 1) / kBlock);
  Accuracy total;
  std::mutex merging;
  tessera::parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    Accuracy local;
    std::vector<float> x(kBlock), y(kBlock);
    for (int64_t block = begin; block < end; ++block) {
      const uint64_t first = static_cast<uint64_t>(block) * kBlock;
      const auto n = static_cast<int64_t>(std::min<uint64_t>(kBlock, count - first));
      for (int64_t i = 0; i < n; ++i) x[i] = float_of_bits(static_cast<uint32_t>((first + i) * stride));
      function.vectorised(y.data(), x.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double exact = function.exact(x[i]);
        const double error = tessera::cpu::ulp_error(y[i], exact);
        if (tessera::cpu::special_value_differs(y[i], exact)) {
          if (local.special_mismatches++ == 0) local.first_mismatch = x[i];
        } else if (error > local.worst_ulp) {
          local.worst_ulp = error, local.worst_input = x[i];
        }
      }
      local.checked += n;
    }
    std::lock_guard lock(merging);
    total.merge(local);
  });
  return total;
}

// ns per element over `values`, best of 5, one thread.
double time_ns(const std::function<void(float*, const float*, int64_t)>& run, const std::vector<float>& values) {
  std::vector<float> out(values.size());
  double best = 1e30;
  for (int repeat = 0; repeat < 5; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    run(out.data(), values.data(), static_cast<int64_t>(values.size()));
    const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count() / static_cast<double>(values.size()));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Accuracy (ulp against std:: in double) and speed of the vectorised f32 maths"};
  uint64_t stride = 1;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  app.add_option("--stride", stride, "check every N-th float bit pattern (1 = all 2^32)")->check(CLI::Range(1, 1 << 30));
  app.add_option("--threads", threads, "threads for the accuracy sweep")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  tessera::set_num_threads(threads);

  fmt::print("# vector_math bench: cpu={} ({} cores online, load average {}), vector ISA {} ({} floats per vector)\n",
             bench::cpu_model(), std::thread::hardware_concurrency(), bench::load_average(), bench::vector_isa(),
             FloatVector::kWidth);
  fmt::print("# accuracy over {} of the 2^32 floats; speed: ns/element, 1 thread, 1M values in [-10, 10] "
             "(log: (0, 10])\n",
             stride == 1 ? std::string("all") : fmt::format("every {}th", stride));
  fmt::print("{:<8} {:>9} {:>15} {:>9} {:>11} {:>10} {:>9} {:>9}\n", "function", "max ulp", "at x", "specials",
             "checked", "tessera ns", "eigen ns", "std:: ns");
  std::vector<float> symmetric(1 << 20), positive(1 << 20);
  for (size_t i = 0; i < symmetric.size(); ++i) {
    const float t = static_cast<float>(i) / static_cast<float>(symmetric.size());
    symmetric[i] = -10.0f + 20.0f * t;
    positive[i] = 10.0f * (t + 1e-6f);
  }
  for (const Function& function : functions()) {
    const Accuracy accuracy = measure(function, stride);
    const std::vector<float>& values = std::strcmp(function.name, "log") == 0 ? positive : symmetric;
    tessera::set_num_threads(1);
    const double vector_ns = time_ns(function.vectorised, values);
    const double eigen_ns = time_ns(eigen_kernel(function.eigen), values);
    const double scalar_ns = time_ns(
        [&](float* out, const float* x, int64_t n) {
          for (int64_t i = 0; i < n; ++i) out[i] = function.scalar(x[i]);
        },
        values);
    tessera::set_num_threads(threads);
    fmt::print("{:<8} {:>9.3f} {:>15.9g} {:>9} {:>11} {:>10.2f} {:>9.2f} {:>9.2f}\n", function.name,
               accuracy.worst_ulp, accuracy.worst_input, accuracy.special_mismatches, accuracy.checked, vector_ns,
               eigen_ns, scalar_ns);
    if (accuracy.special_mismatches > 0) {
      fmt::print("  first special value that differs from std::: x = {:.9g}\n", accuracy.first_mismatch);
    }
  }
}
