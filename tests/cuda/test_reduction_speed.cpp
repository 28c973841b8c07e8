// The shapes of a training step's gradient reductions, on cuda: column sums
// of [rows, cols] (bias gradients), the norm weight and bias gradients and
// GELU's backward. Each against the cpu (or the strided kernel it replaces)
// and from run to run under another block order, and, on the simulator, the
// launches' blocks and device bytes against the ideal: what keeps these
// kernels spread over the whole GPU and reading their inputs once.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#if TESSERA_SIM_CHECKS
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

using namespace tessera;

namespace {

const Device kCuda(DeviceType::cuda);

// Exactly the values of a cpu or cuda tensor (bf16 and f32 widen exactly).
std::vector<double> values_of(const Tensor& t) {
  return ops::to(ops::to(ops::contiguous(t), kCPU), DType::f64).to_vector<double>();
}

// The spacing of `dtype`'s values at v.
double ulp_at(double v, DType dtype) {
  const int mantissa_bits = dtype == DType::bf16 ? 7 : 23;
  return std::ldexp(1.0, std::ilogb(std::max(std::abs(v), 1e-30)) - mantissa_bits);
}

void set_block_order(uint64_t seed) {
#if TESSERA_SIM_CHECKS
  cuda::sim::set_block_order_seed(seed);
#else
  (void)seed;
#endif
}

#if TESSERA_SIM_CHECKS
// The simulator's counters of each kernel `run` launches.
std::map<std::string, cuda::sim::KernelCounters> counters_of(const std::function<void()>& run) {
  current_stream(kCuda)->synchronize();
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(kCuda)->synchronize();
  return cuda::sim::kernel_counters();
}

// The counters of the one kernel whose name contains `part`.
cuda::sim::KernelCounters kernel_named(const std::map<std::string, cuda::sim::KernelCounters>& counters,
                                       const std::string& part) {
  std::optional<cuda::sim::KernelCounters> found;
  for (const auto& [name, counter] : counters) {
    if (name.find(part) == std::string::npos) continue;
    CHECK_MESSAGE(!found, "two kernels named like " << part);
    found = counter;
  }
  REQUIRE_MESSAGE(found, "no kernel named like " << part);
  return *found;
}

int64_t total_bytes(const std::map<std::string, cuda::sim::KernelCounters>& counters) {
  int64_t total = 0;
  for (const auto& [name, counter] : counters) total += counter.device_bytes_read + counter.device_bytes_written;
  return total;
}
#endif

}  // namespace

TEST_CASE("column sums match the cpu and are the same bits on every run and block order") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{4099, 37}, {2048, 768}}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(rows);
      const Tensor x = ops::to(ops::randn({rows, cols}, PhiloxKey{11, static_cast<uint64_t>(cols)}), dtype);
      const Tensor device = ops::to(x, kCuda);
      // Both sum in f64 (each within n 2^-53 sum|x| of the exact sum), then round once.
      const std::vector<double> cpu = values_of(ops::sum(x, {0}, true));
      const std::vector<double> magnitude = values_of(ops::sum(ops::to(ops::abs(x), DType::f64), {0}, true));
      set_block_order(1);
      const std::vector<double> gpu = values_of(ops::sum(device, {0}, true));
      REQUIRE(gpu.size() == cpu.size());
      for (size_t i = 0; i < cpu.size(); ++i) {
        CHECK(std::abs(cpu[i] - gpu[i]) <= ulp_at(cpu[i], dtype) + rows * 0x1p-52 * magnitude[i]);
      }
      set_block_order(977);  // blocks in another order
      CHECK(values_of(ops::sum(device, {0}, true)) == gpu);
      // A [rows / 2, 2, cols] view summed over its first two dims is the same sum.
      if (rows % 2 == 0) CHECK(values_of(ops::sum(ops::reshape(device, {rows / 2, 2, cols}), {0, 1}, true)) == gpu);
    }
  }
}

#if TESSERA_SIM_CHECKS
TEST_CASE("a bias gradient's column sum spreads over the GPU and reads its input once") {
  const int64_t rows = 16384, cols = 768;
  const Tensor x = ops::to(ops::to(ops::randn({rows, cols}, PhiloxKey{12, 1}), DType::bf16), kCuda);
  const Tensor out = ops::empty({1, cols}, {.dtype = DType::bf16, .device = kCuda});
  const auto counters = counters_of([&] { kernels(kCuda).reduce(ReduceOp::sum, out, x, {true, false}); });
  const cuda::sim::KernelCounters chunks = kernel_named(counters, "reduce_columns_kernel<OpOf<T>");
  const cuda::sim::KernelCounters total = kernel_named(counters, "reduce_columns_kernel<OpOf<Acc>");
  MESSAGE("chunk pass: " << chunks.blocks << " blocks, " << chunks.device_bytes_read << " bytes read, "
                         << chunks.device_bytes_written << " written; chunk sum: " << total.blocks << " blocks, "
                         << total.device_bytes_read << " read");
  CHECK(chunks.blocks >= 132);  // an H100's SMs
  CHECK(chunks.device_bytes_read == rows * cols * 2);
  CHECK(total.device_bytes_read == chunks.device_bytes_written);  // the f64 partials, once each way
  const int64_t ideal = rows * cols * 2 + cols * 2;
  MESSAGE("bytes " << total_bytes(counters) << ", ideal " << ideal);
  CHECK(static_cast<double>(total_bytes(counters)) <= 1.1 * static_cast<double>(ideal));
}

TEST_CASE("norm weight and bias gradients: the partials' sum spreads over the GPU and reads them once") {
  const int64_t rows = 2048, cols = 768;
  const auto device = [](const Tensor& t) { return ops::to(ops::to(t, DType::bf16), kCuda); };
  const Tensor x = device(ops::randn({rows, cols}, PhiloxKey{13, 1}));
  const Tensor gy = device(ops::randn({rows, cols}, PhiloxKey{13, 2}));
  const Tensor w = device(ops::randn({cols}, PhiloxKey{13, 3}));
  const Tensor b = device(ops::randn({cols}, PhiloxKey{13, 4}));
  const ops::NormOutput forward = ops::layer_norm(x, w, b, 1e-5);
  const auto empty = [&](const Shape& shape) { return ops::empty(shape, {.dtype = DType::bf16, .device = kCuda}); };
  const Tensor dx = empty({rows, cols}), gw = empty({cols}), gb = empty({cols});
  const auto run = [&] { kernels(kCuda).norm_backward(dx, gw, gb, gy, x, w, forward.mean, forward.rstd); };
  const auto counters = counters_of(run);
  const cuda::sim::KernelCounters rows_pass = kernel_named(counters, "norm_backward_kernel");
  const cuda::sim::KernelCounters sum = kernel_named(counters, "norm_parameter_grads_kernel");
  MESSAGE("row pass " << rows_pass.blocks << " blocks; partials' sum " << sum.blocks << " blocks, "
                      << sum.device_bytes_read << " bytes read, " << sum.device_bytes_written << " written");
  CHECK(sum.blocks >= 132);
  CHECK(sum.device_bytes_read == rows_pass.blocks * 2 * cols * 4);  // each f32 partial once
  CHECK(sum.device_bytes_written == 2 * cols * 2);
  const std::vector<double> weight = values_of(gw), bias = values_of(gb);
  set_block_order(4242);
  run();
  CHECK(values_of(gw) == weight);
  CHECK(values_of(gb) == bias);
  // The bias gradient alone: the same bits.
  const Tensor gb_only = empty({cols});
  kernels(kCuda).norm_backward(Tensor(), Tensor(), gb_only, gy, x, w, forward.mean, forward.rstd);
  CHECK(values_of(gb_only) == bias);
}

TEST_CASE("GELU's backward on dense bf16 moves 16-byte packs, its ideal bytes, and the strided kernel's bits") {
  const int64_t rows = 64, cols = 3072, n = rows * cols;
  const auto device = [](const Tensor& t) { return ops::to(ops::to(t, DType::bf16), kCuda); };
  const Tensor x = device(ops::mul(ops::randn({rows, cols}, PhiloxKey{14, 1}), ops::full({}, 3.0)));
  const Tensor gy = device(ops::randn({rows, cols}, PhiloxKey{14, 2}));
  const Tensor dx = ops::empty({rows, cols}, {.dtype = DType::bf16, .device = kCuda});
  for (const UnaryOp op : {UnaryOp::gelu_tanh, UnaryOp::gelu_erf, UnaryOp::silu, UnaryOp::tanh}) {
    const auto counters = counters_of([&] { kernels(kCuda).unary_backward(op, dx, gy, x); });
    const cuda::sim::KernelCounters packed = kernel_named(counters, "unary_backward_packed_kernel");
    CHECK(packed.device_bytes_read == 2 * n * 2);
    CHECK(packed.device_bytes_written == n * 2);
    CHECK(static_cast<double>(total_bytes(counters)) <= 1.1 * static_cast<double>(3 * n * 2));
    // The strided kernel on transposed views: the same bits.
    const Tensor dx_t = ops::empty({cols, rows}, {.dtype = DType::bf16, .device = kCuda});
    const Tensor gy_t = ops::transpose(ops::contiguous(ops::transpose(gy, 0, 1)), 0, 1);
    const Tensor x_t = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);
    const auto strided = counters_of([&] { kernels(kCuda).unary_backward(op, ops::transpose(dx_t, 0, 1), gy_t, x_t); });
    kernel_named(strided, "unary_backward_kernel<S>");
    CHECK(values_of(ops::transpose(dx_t, 0, 1)) == values_of(dx));
  }
}
#endif
