// The conformance suite: kernels in the styles CUDA code is written in
// (tests/cuda/conformance_kernels.cu, compiled unchanged by nvcc in the nvidia
// build) run on the simulator, without a report from its checks, and match
// CPU references.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tests/cuda/conformance_kernels.h"
#include "tests/cuda/device_buffer.h"

namespace {

std::vector<float> random_floats(size_t count, uint32_t seed, float scale) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(random);
  return values;
}

}  // namespace

TEST_CASE("conformance: block reductions (cooperative groups, extern __shared__) and a warp-shuffle maximum per row") {
  const int rows = 6, cols = 1000;
  const std::vector<float> x = random_floats(rows * cols, 1, 4.0f);
  DeviceBuffer<float> dx(x), sums(rows), tree_sums(rows), maxima(rows);
  conformance_kernels::row_sums_cooperative(dx.get(), sums.get(), rows, cols);
  conformance_kernels::row_sums_extern_shared(dx.get(), tree_sums.get(), rows, cols);
  conformance_kernels::row_max_warp(dx.get(), maxima.get(), rows, cols);
  for (int row = 0; row < rows; ++row) {
    double sum = 0;
    for (int col = 0; col < cols; ++col) sum += x[row * cols + col];
    CHECK(sums.read()[row] == doctest::Approx(sum).epsilon(1e-5));
    CHECK(tree_sums.read()[row] == doctest::Approx(sum).epsilon(1e-5));
    CHECK(maxima.read()[row] == *std::max_element(x.begin() + row * cols, x.begin() + (row + 1) * cols));
  }
}

TEST_CASE("conformance: online softmax, a warp per row") {
  const int rows = 5, cols = 300;
  const std::vector<float> x = random_floats(rows * cols, 2, 20.0f);
  DeviceBuffer<float> dx(x), dy(rows * cols);
  conformance_kernels::softmax_online(dx.get(), dy.get(), rows, cols);
  const std::vector<float> y = dy.read();
  for (int row = 0; row < rows; ++row) {
    const double peak = *std::max_element(x.begin() + row * cols, x.begin() + (row + 1) * cols);
    double total = 0;
    for (int col = 0; col < cols; ++col) total += std::exp(x[row * cols + col] - peak);
    for (int col = 0; col < cols; ++col) {
      CHECK(y[row * cols + col] == doctest::Approx(std::exp(x[row * cols + col] - peak) / total).epsilon(1e-5));
    }
  }
}

TEST_CASE("conformance: layer norm with float4 loads, cache hints, rsqrtf and streaming stores") {
  const int rows = 3, cols = 256;
  const std::vector<float> x = random_floats(rows * cols, 3, 2.0f), weight = random_floats(cols, 4, 1.0f),
                           bias = random_floats(cols, 5, 1.0f);
  DeviceBuffer<float> dx(x), dw(weight), db(bias), dy(rows * cols);
  conformance_kernels::layer_norm_vectorized(dx.get(), dw.get(), db.get(), dy.get(), rows, cols);
  const std::vector<float> y = dy.read();
  for (int row = 0; row < rows; ++row) {
    double mean = 0, squares = 0;
    for (int col = 0; col < cols; ++col) mean += x[row * cols + col];
    mean /= cols;
    for (int col = 0; col < cols; ++col) squares += (x[row * cols + col] - mean) * (x[row * cols + col] - mean);
    const double inv_std = 1.0 / std::sqrt(squares / cols + 1e-5);
    for (int col = 0; col < cols; ++col) {
      const double expected = (x[row * cols + col] - mean) * inv_std * weight[col] + bias[col];
      CHECK(y[row * cols + col] == doctest::Approx(expected).epsilon(1e-4).scale(1.0));
    }
  }
}

TEST_CASE("conformance: integer and bit built-ins, block votes at a barrier, sm_80 warp reductions and matches") {
  std::vector<unsigned> values(256);
  for (unsigned t = 0; t < 256; ++t) values[t] = t < 64 ? 4096u + t % 3 : t * 37u % 997u;
  DeviceBuffer<unsigned> dvalues(values);
  DeviceBuffer<int> out(259 + 6 * 8);
  conformance_kernels::integer_builtins(dvalues.get(), out.get());
  const std::vector<int> result = out.read();
  for (int t = 0; t < 256; ++t) {
    const unsigned v = values[t];
    const int ffs = v == 0 ? 0 : std::countr_zero(v) + 1;
    CHECK(result[t] == std::popcount(v) * 10000 + std::countl_zero(v) * 100 + ffs);
  }
  int odd = 0, below = 1, zero = 0;
  for (const unsigned v : values) {
    odd += static_cast<int>(v & 1u);
    below = below && v < 1000u;
    zero = zero || v == 0u;
  }
  CHECK(result[256] == odd);
  CHECK(result[257] == below);
  CHECK(result[258] == zero);
  for (int warp = 0; warp < 8; ++warp) {
    CAPTURE(warp);
    unsigned same_parity = 0, sum = 0, maximum = 0, equal_mask = 0xffffffffu;
    int minimum = INT32_MAX;
    for (int lane = 0; lane < 32; ++lane) {
      const unsigned v = values[warp * 32 + lane];
      if ((v & 1u) == (values[warp * 32] & 1u)) same_parity |= 1u << lane;
      sum += v;
      maximum = std::max(maximum, v);
      minimum = std::min(minimum, static_cast<int>(v) - 500);
      if (v / 4096u != values[warp * 32] / 4096u) equal_mask = 0;
    }
    CHECK(static_cast<unsigned>(result[259 + 6 * warp]) == same_parity);
    CHECK(static_cast<unsigned>(result[260 + 6 * warp]) == sum);
    CHECK(static_cast<unsigned>(result[261 + 6 * warp]) == maximum);
    CHECK(result[262 + 6 * warp] == minimum);
    CHECK(static_cast<unsigned>(result[263 + 6 * warp]) == equal_mask);
    CHECK(result[264 + 6 * warp] == (equal_mask != 0));
  }
}

TEST_CASE("conformance: every atomic, including bf16 and f16 adds") {
  const int threads = 64;
  DeviceBuffer<int> ints(std::vector<int>{0, 0, INT32_MIN, INT32_MAX});
  DeviceBuffer<unsigned> unsigneds(std::vector<unsigned>{0xffffffffu, 0u, 0u, 0u, 0u, 0u});
  DeviceBuffer<unsigned long long> wide(std::vector<unsigned long long>{0, 0});
  DeviceBuffer<long long> signed_wide(std::vector<long long>{0});
  DeviceBuffer<float> floats(std::vector<float>{0.0f, 0.0f});
  DeviceBuffer<__nv_bfloat16> bf16s(std::vector<__nv_bfloat16>{__float2bfloat16(0.0f)});
  DeviceBuffer<__half> halves(std::vector<__half>{__float2half(0.0f)});
  conformance_kernels::atomics(ints.get(), unsigneds.get(), wide.get(), signed_wide.get(), floats.get(), bf16s.get(),
                               halves.get(), threads);
  const int total = threads * (threads - 1) / 2;
  CHECK(ints.read() == std::vector<int>{total, -total, threads - 1 - 7, 100 - (threads - 1)});
  const std::vector<unsigned> u = unsigneds.read();
  CHECK(u[0] == 0u);                                         // every bit cleared by some thread
  CHECK(u[1] == 0xffffffffu);                                // and set
  CHECK(u[2] == 0u);                                         // each of 8 bits flipped 8 times
  CHECK(u[3] == threads % 10);                               // atomicInc wraps past 9
  CHECK(u[4] == static_cast<unsigned>((10 - threads % 10) % 10));  // atomicDec wraps below 0 to 9
  CHECK(u[5] >= 1u);                                         // thread 0's swap always succeeds
  CHECK(u[5] <= static_cast<unsigned>(threads));
  CHECK(wide.read() == std::vector<unsigned long long>{threads * (1ull << 33), static_cast<unsigned long long>(threads - 1) << 40});
  CHECK(signed_wide.read()[0] == -static_cast<long long>(threads - 1) * (1ll << 35));
  CHECK(floats.read() == std::vector<float>{2.5f, threads * 0.25f});
  CHECK(__bfloat162float(bf16s.read()[0]) == static_cast<float>(threads));  // exact up to 256
  CHECK(__half2float(halves.read()[0]) == threads * 0.5f);
}

TEST_CASE("conformance: __nv_bfloat162 shuffles whole, and a clock64 wait with __nanosleep ends") {
  std::vector<__nv_bfloat162> pairs(32);
  for (int lane = 0; lane < 32; ++lane) pairs[lane] = __floats2bfloat162_rn(static_cast<float>(lane), -1.0f * lane);
  DeviceBuffer<__nv_bfloat162> in(pairs), out(32);
  conformance_kernels::shuffle_bfloat162(in.get(), out.get());
  const std::vector<__nv_bfloat162> shuffled = out.read();
  for (int lane = 0; lane < 32; ++lane) {
    CHECK(__low2float(shuffled[lane]) == static_cast<float>((lane + 1) % 32));
    CHECK(__high2float(shuffled[lane]) == -1.0f * ((lane + 1) % 32));
  }
  DeviceBuffer<int> done(1);
  conformance_kernels::bounded_wait(done.get());
  CHECK(done.read()[0] == 1);
}
