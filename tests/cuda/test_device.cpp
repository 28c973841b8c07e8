// The cuda device on the simulator against the cpu: transfers, fills,
// copies and casts bit for bit, elementwise ops bit for bit where IEEE rounds
// them exactly and within a stated ulp bound where a math library is
// involved, the memory statistics, the byte counts of the memory-bound
// kernels, and the errors a user can hit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/stream.h"

using namespace tessera;

namespace {

const Device kCuda(DeviceType::cuda);

// Special values first (signed zeros, infinities, NaN, subnormals, the f32
// extremes), then random magnitudes over many binades.
template <typename T>
std::vector<T> test_values(size_t random_count) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  std::vector<T> values = {T(0),  T(-0.0), inf,   -inf,        std::numeric_limits<T>::quiet_NaN(),
                           T(1),  T(-1),   T(0.5), T(-2.5),    std::numeric_limits<T>::denorm_min(),
                           T(-3e-39), T(88.7), T(-87.5), T(1e30), T(-1e30), T(1e-8), T(40), T(-40), T(3), T(-3)};
  std::mt19937_64 random(42);
  std::uniform_real_distribution<double> exponent(-12.0, 12.0), sign(-1.0, 1.0);
  for (size_t i = 0; i < random_count; ++i) {
    values.push_back(static_cast<T>(std::copysign(std::exp2(exponent(random)), sign(random))));
  }
  return values;
}

template <typename T>
Tensor host_tensor(const std::vector<T>& values) {
  Tensor tensor = ops::empty({static_cast<int64_t>(values.size())}, {.dtype = dtype_of<T>::value});
  std::memcpy(tensor.raw_data(), values.data(), values.size() * sizeof(T));
  return tensor;
}

// The raw bytes of a cpu tensor (NaN payloads and signed zeros included).
std::vector<uint8_t> bytes_of(const Tensor& tensor) {
  const Tensor dense = ops::contiguous(tensor);
  std::vector<uint8_t> bytes(static_cast<size_t>(dense.nbytes()));
  if (!bytes.empty()) std::memcpy(bytes.data(), dense.raw_data(), bytes.size());
  return bytes;
}

bool bitwise_equal(const Tensor& cpu, const Tensor& cuda) {
  return bytes_of(cpu) == bytes_of(ops::to(cuda, kCPU));
}

// The spacing of T's values at |value| (the smallest normal's below it).
template <typename T>
double ulp_at(double value) {
  const int exponent = std::max(std::ilogb(std::abs(value)), std::numeric_limits<T>::min_exponent - 1);
  return std::ldexp(1.0, exponent - std::numeric_limits<T>::digits + 1);
}

}  // namespace

TEST_CASE("every dtype goes to the device and back bit for bit, and casts there as on the cpu") {
  std::vector<uint8_t> pattern(4096);
  std::mt19937 random(7);
  for (auto& byte : pattern) byte = static_cast<uint8_t>(random());
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    CAPTURE(dtype_name(dtype));
    Tensor host = ops::empty({8, 16}, {.dtype = dtype});
    std::memcpy(host.raw_data(), pattern.data(), static_cast<size_t>(host.nbytes()));
    if (dtype == DType::boolean) host = ops::ne(host, ops::zeros({8, 16}, {.dtype = DType::boolean}));
    const Tensor device = ops::to(host, kCuda);
    CHECK(device.device() == kCuda);
    CHECK(bitwise_equal(host, device));
    for (const DType target : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64,
                               DType::boolean}) {
      CAPTURE(dtype_name(target));
      CHECK(bitwise_equal(ops::to(host, target), ops::to(device, target)));
    }
    // Strided and broadcast views: a transpose, a column, an expanded row.
    CHECK(bitwise_equal(ops::contiguous(ops::transpose(host, 0, 1)), ops::contiguous(ops::transpose(device, 0, 1))));
    Tensor into_strided = ops::empty({16, 8}, {.dtype = dtype, .device = kCuda});
    Tensor strided_view = ops::transpose(into_strided, 0, 1);
    ops::copy_(strided_view, host);  // host to a non-contiguous device view
    CHECK(bitwise_equal(host, strided_view));
    const Tensor row = ops::slice(device, 0, 2, 3);
    CHECK(bitwise_equal(ops::contiguous(ops::expand(ops::slice(host, 0, 2, 3), {5, 16})),
                        ops::contiguous(ops::expand(row, {5, 16}))));
  }
}

TEST_CASE("fill and arange on the device equal the cpu's bits") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    CAPTURE(dtype_name(dtype));
    for (const int64_t count : {int64_t{1}, int64_t{13}, int64_t{4096}, int64_t{4099}}) {
      CHECK(bitwise_equal(ops::full({count}, -2.75, {.dtype = dtype}), ops::full({count}, -2.75, {.dtype = dtype, .device = kCuda})));
    }
    if (dtype != DType::boolean) {
      CHECK(bitwise_equal(ops::arange(-3.0, 500.0, 0.7, {.dtype = dtype}),
                          ops::arange(-3.0, 500.0, 0.7, {.dtype = dtype, .device = kCuda})));
    }
  }
}

TEST_CASE("unary ops: IEEE-exact ones bit for bit, the maths within 4 ulp plus erf's absolute error") {
  const std::vector<UnaryOp> exact = {UnaryOp::neg, UnaryOp::abs, UnaryOp::relu, UnaryOp::sqrt, UnaryOp::rsqrt};
  const std::vector<UnaryOp> maths = {UnaryOp::exp, UnaryOp::log, UnaryOp::tanh, UnaryOp::sigmoid,
                                      UnaryOp::gelu_tanh, UnaryOp::gelu_erf, UnaryOp::silu};
  const auto run = [](UnaryOp op, const Tensor& x) {
    Tensor out = ops::empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
    kernels(x.device()).unary(op, out, x);
    return out;
  };
  const auto check_dtype = [&]<typename T>(T) {
    const Tensor host = host_tensor(test_values<T>(3000));
    const Tensor device = ops::to(host, kCuda);
    for (const UnaryOp op : exact) CHECK(bitwise_equal(run(op, host), run(op, device)));
    for (const UnaryOp op : maths) {
      const std::vector<T> cpu = run(op, host).to_vector<T>(), gpu = run(op, device).to_vector<T>();
      const std::vector<T> x = host.to_vector<T>();
      double worst = 0.0;
      for (size_t i = 0; i < x.size(); ++i) {
        CAPTURE(static_cast<int>(op));
        CAPTURE(x[i]);
        if (std::isnan(cpu[i]) || std::isinf(cpu[i])) {
          const bool same = std::memcmp(&cpu[i], &gpu[i], sizeof(T)) == 0 || (std::isnan(cpu[i]) && std::isnan(gpu[i]));
          CHECK(same);
          continue;
        }
        // Each side within 2 ulp of the exact value; gelu_erf loses relative
        // accuracy where 1 + erf cancels, by |x| times erf's absolute error.
        const double bound = 4.0 * ulp_at<T>(std::max(std::abs(double(cpu[i])), std::abs(double(gpu[i])))) +
                             std::numeric_limits<T>::epsilon() * std::abs(double(x[i]));
        const double error = std::abs(double(cpu[i]) - double(gpu[i]));
        worst = std::max(worst, error / bound);
        CHECK(error <= bound);
      }
      MESSAGE(dtype_name(dtype_of<T>::value), " op ", static_cast<int>(op), ": worst difference ", worst, " of the bound");
    }
  };
  check_dtype(float{});
  check_dtype(double{});
  // Integers and bool, exactly.
  const Tensor integers = ops::arange(-50.0, 50.0, 1.0, {.dtype = DType::i64});
  for (const UnaryOp op : {UnaryOp::neg, UnaryOp::abs, UnaryOp::relu}) {
    CHECK(bitwise_equal(run(op, integers), run(op, ops::to(integers, kCuda))));
  }
  const Tensor flags = ops::gt(ops::arange(0.0, 10.0, 1.0), ops::full({10}, 4.5));
  CHECK(bitwise_equal(run(UnaryOp::logical_not, flags), run(UnaryOp::logical_not, ops::to(flags, kCuda))));
}

TEST_CASE("unary backward, binary ops and where on the device") {
  const Tensor x = host_tensor(test_values<float>(2000));
  std::vector<float> reversed = x.to_vector<float>();
  std::reverse(reversed.begin(), reversed.end());
  const Tensor y = host_tensor(reversed);
  const Tensor dx = ops::to(x, kCuda), dy = ops::to(y, kCuda);
  for (const BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum,
                            BinaryOp::minimum, BinaryOp::eq, BinaryOp::ne, BinaryOp::lt, BinaryOp::le, BinaryOp::gt,
                            BinaryOp::ge}) {
    CAPTURE(static_cast<int>(op));
    const auto run = [op](const Tensor& a, const Tensor& b) {
      const bool comparison = op >= BinaryOp::eq;
      Tensor out = ops::empty(a.sizes(), {.dtype = comparison ? DType::boolean : a.dtype(), .device = a.device()});
      kernels(a.device()).binary(op, out, a, b);
      return out;
    };
    CHECK(bitwise_equal(run(x, y), run(dx, dy)));
    // A broadcast operand (stride 0) and a strided one.
    const Tensor scalar = ops::full({x.numel()}, 1.5);
    CHECK(bitwise_equal(run(ops::expand(ops::slice(x, 0, 5, 6), {x.numel()}), scalar),
                        run(ops::expand(ops::slice(dx, 0, 5, 6), {x.numel()}), ops::to(scalar, kCuda))));
  }
  const Tensor condition = ops::gt(x, y);
  CHECK(bitwise_equal(ops::where(condition, x, y), ops::where(ops::to(condition, kCuda), dx, dy)));

  const Tensor integers = ops::arange(-20.0, 20.0, 1.0, {.dtype = DType::i32});
  std::vector<int32_t> exponents(40);
  for (int i = 0; i < 40; ++i) exponents[i] = i % 7 - 1;  // -1 truncates toward zero
  const Tensor powers = host_tensor(exponents);
  CHECK(bitwise_equal(ops::pow(integers, powers), ops::pow(ops::to(integers, kCuda), ops::to(powers, kCuda))));

  // Backward of the exact-arithmetic ops, bit for bit.
  for (const UnaryOp op : {UnaryOp::neg, UnaryOp::abs, UnaryOp::relu, UnaryOp::tanh, UnaryOp::sigmoid}) {
    CAPTURE(static_cast<int>(op));
    const auto run = [op](const Tensor& grad, const Tensor& saved) {
      Tensor out = ops::empty(grad.sizes(), {.dtype = grad.dtype(), .device = grad.device()});
      kernels(grad.device()).unary_backward(op, out, grad, saved);
      return out;
    };
    CHECK(bitwise_equal(run(y, x), run(dy, dx)));
  }
}

TEST_CASE("host code never touches device memory; devices do not mix; unwritten kernels say so") {
  const Tensor device = ops::ones({4}, {.device = kCuda});
  CHECK_THROWS_WITH_AS(device.data_ptr<float>(), doctest::Contains("copy it to cpu first"), Error);
  CHECK_THROWS_WITH_AS(device.raw_data(), doctest::Contains("device memory, which host code never reads"), Error);
  CHECK_THROWS_WITH_AS(ops::ones({4}).cuda_data(), doctest::Contains("not cuda"), Error);
  CHECK_THROWS_WITH_AS(ops::add(device, ops::ones({4})), doctest::Contains("operands are on different devices"), Error);
  CHECK_THROWS_WITH_AS(ops::matmul(ops::ones({2, 2}, {.device = kCuda}), ops::ones({2, 2}, {.device = kCuda})),
                       doctest::Contains("matmul has no cuda kernel yet"), Error);
  CHECK(ops::full({}, 2.5, {.device = kCuda}).item() == 2.5);  // item() goes through the copy API
}

TEST_CASE("memory: statistics, no device malloc in steady state, and exact bytes moved by the dense kernels") {
  const int64_t count = 1 << 16;
  const Tensor x = ops::to(ops::arange(0.0, static_cast<double>(count), 1.0), kCuda);
  const cuda::AllocatorStats before = cuda::CachingAllocator::instance().stats();
  const MemoryStats device_stats = memory_stats(kCuda);
  CHECK(device_stats.live_bytes >= count * 4);
  for (int step = 0; step < 5; ++step) {
    const Tensor y = ops::exp(ops::neg(x));
    CHECK(memory_stats(kCuda).live_bytes == device_stats.live_bytes + count * 4);
  }
  CHECK(cuda::CachingAllocator::instance().stats().device_mallocs <= before.device_mallocs + 1);  // the first step's segment at most
  const int64_t mallocs = cuda::CachingAllocator::instance().stats().device_mallocs;
  for (int step = 0; step < 5; ++step) ops::exp(ops::neg(x));
  CHECK(cuda::CachingAllocator::instance().stats().device_mallocs == mallocs);

  current_stream(kCuda)->synchronize();  // earlier launches count before the reset, not after
  cuda::sim::reset_kernel_counters();
  const Tensor y = ops::neg(x);
  current_stream(kCuda)->synchronize();
  const auto counters = cuda::sim::kernel_counters();
  int64_t read = 0, written = 0;
  for (const auto& [name, counter] : counters) {
    read += counter.device_bytes_read;
    written += counter.device_bytes_written;
  }
  CHECK(read == count * 4);  // each input read once, with 16-byte loads
  CHECK(written == count * 4);
}
