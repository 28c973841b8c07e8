// The cuda device against the cpu (on the simulator, and on a GPU in an
// nvidia build): transfers, fills, copies and casts bit for bit, elementwise
// ops bit for bit where IEEE rounds them exactly (a NaN may come back as any
// NaN: same_values) and within a stated ulp
// bound where a math library is involved, the memory statistics, the byte
// counts of the memory-bound kernels (simulator only), and the errors a user
// can hit.
#include <doctest/doctest.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/pinned_pool.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/stream.h"

#include "tests/cuda/counted_bytes.h"

using namespace tessera;
using tessera::testing::counted_bytes;
using tessera::testing::CountedBytes;


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

// Equal bytes, NaN payloads included: what a transfer or a copy must keep.
bool bitwise_equal(const Tensor& cpu, const Tensor& cuda) { return bytes_of(cpu) == bytes_of(ops::to(cuda, kCPU)); }

// Whether `bytes` (one element of `dtype`) hold a NaN: exponent all ones and
// a nonzero mantissa.
bool is_nan_bits(DType dtype, const uint8_t* bytes) {
  uint64_t bits = 0;
  std::memcpy(&bits, bytes, element_size(dtype));
  switch (dtype) {
    case DType::f64: return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (bits & 0xfffffffffffffull);
    case DType::f32: return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu);
    case DType::bf16: return (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu);
    case DType::f16: return (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu);
    default: return false;
  }
}

// Equal bytes, except that any NaN equals any NaN: CUDA's arithmetic returns
// the canonical NaN 0x7fffffff where x86 keeps the operand's payload or makes
// 0xffc00000 (an H100 showed both, tools/gpu_check.sh 2026-11-26; PTX leaves
// NaN results unspecified), so a NaN's sign and payload are not part of
// tessera's contract. The simulator runs the kernels on the CPU and keeps x86's
// NaNs. Differences are reported with both bit patterns.
bool same_values(const Tensor& cpu, const Tensor& cuda) {
  const std::vector<uint8_t> want = bytes_of(cpu), got = bytes_of(ops::to(cuda, kCPU));
  if (want.size() != got.size()) return false;
  const size_t size = cpu.element_size();
  const auto hex = [size](const std::vector<uint8_t>& bytes, size_t element) {
    std::string text = "0x";
    for (size_t b = size; b-- > 0;) text += fmt::format("{:02x}", bytes[element * size + b]);
    return text;
  };
  int differences = 0;
  for (size_t element = 0; element * size < want.size(); ++element) {
    const uint8_t* w = &want[element * size];
    const uint8_t* g = &got[element * size];
    if (std::memcmp(w, g, size) == 0 || (is_nan_bits(cpu.dtype(), w) && is_nan_bits(cpu.dtype(), g))) continue;
    if (differences++ < 4) MESSAGE("element ", element, ": cpu ", hex(want, element), ", cuda ", hex(got, element));
  }
  return differences == 0;
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
  for (const DType dtype :
       {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean, DType::u8,
        DType::f8e4m3, DType::f8e5m2}) {
    CAPTURE(dtype_name(dtype));
    Tensor host = ops::empty({8, 16}, {.dtype = dtype});
    std::memcpy(host.raw_data(), pattern.data(), static_cast<size_t>(host.nbytes()));
    if (dtype == DType::boolean) {  // a bool byte other than 0 or 1 is undefined behaviour to read
      auto* flags = static_cast<uint8_t*>(host.raw_data());
      for (int64_t i = 0; i < host.numel(); ++i) flags[i] &= 1;
    }
    const Tensor device = ops::to(host, kCuda);
    CHECK(device.device() == kCuda);
    CHECK(bitwise_equal(host, device));
    for (const DType target : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64,
                               DType::boolean, DType::u8, DType::f8e4m3, DType::f8e5m2}) {
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

TEST_CASE("nf4 weights dequantise on the device to the cpu's bits, in every output dtype") {
  // 3 rows of 64 x 257 + 3: a partial last block and two scale groups a row.
  const int64_t in = 64 * 257 + 3;
  Tensor weights = ops::randn({3, in}, PhiloxKey{11, 2});
  weights = ops::mul(weights, ops::from_vector(std::vector<double>{0.01, 0.2, 3.0}, {3, 1}));
  const Tensor packed = ops::nf4_quantize(weights);
  const Tensor on_device = ops::nf4_quantize(ops::to(weights, kCuda));
  CHECK(on_device.device() == kCuda);
  CHECK(bitwise_equal(packed, on_device));  // packed on the host, whatever the weight's device
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    CHECK(bitwise_equal(ops::nf4_dequantize(packed, in, dtype), ops::nf4_dequantize(on_device, in, dtype)));
  }
}

TEST_CASE("fill and arange on the device equal the cpu's bits") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    CAPTURE(dtype_name(dtype));
    for (const int64_t count : {int64_t{1}, int64_t{13}, int64_t{4096}, int64_t{4099}}) {
      CHECK(same_values(ops::full({count}, -2.75, {.dtype = dtype}), ops::full({count}, -2.75, {.dtype = dtype, .device = kCuda})));
    }
    if (dtype != DType::boolean) {
      CHECK(same_values(ops::arange(-3.0, 500.0, 0.7, {.dtype = dtype}),
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
    for (const UnaryOp op : exact) CHECK(same_values(run(op, host), run(op, device)));
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
    CHECK(same_values(run(op, integers), run(op, ops::to(integers, kCuda))));
  }
  const Tensor flags = ops::gt(ops::arange(0.0, 10.0, 1.0), ops::full({10}, 4.5));
  CHECK(same_values(run(UnaryOp::logical_not, flags), run(UnaryOp::logical_not, ops::to(flags, kCuda))));
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
    CHECK(same_values(run(x, y), run(dx, dy)));
    // A broadcast operand (stride 0) and a strided one.
    const Tensor scalar = ops::full({x.numel()}, 1.5);
    CHECK(same_values(run(ops::expand(ops::slice(x, 0, 5, 6), {x.numel()}), scalar),
                        run(ops::expand(ops::slice(dx, 0, 5, 6), {x.numel()}), ops::to(scalar, kCuda))));
  }
  const Tensor condition = ops::gt(x, y);
  CHECK(same_values(ops::where(condition, x, y), ops::where(ops::to(condition, kCuda), dx, dy)));

  const Tensor integers = ops::arange(-20.0, 20.0, 1.0, {.dtype = DType::i32});
  std::vector<int32_t> exponents(40);
  for (int i = 0; i < 40; ++i) exponents[i] = i % 7 - 1;  // -1 truncates toward zero
  const Tensor powers = host_tensor(exponents);
  CHECK(same_values(ops::pow(integers, powers), ops::pow(ops::to(integers, kCuda), ops::to(powers, kCuda))));

  // Backward of the exact-arithmetic ops, bit for bit.
  for (const UnaryOp op : {UnaryOp::neg, UnaryOp::abs, UnaryOp::relu, UnaryOp::tanh, UnaryOp::sigmoid}) {
    CAPTURE(static_cast<int>(op));
    const auto run = [op](const Tensor& grad, const Tensor& saved) {
      Tensor out = ops::empty(grad.sizes(), {.dtype = grad.dtype(), .device = grad.device()});
      kernels(grad.device()).unary_backward(op, out, grad, saved);
      return out;
    };
    CHECK(same_values(run(y, x), run(dy, dx)));
  }
}

TEST_CASE("binary ops with a broadcast operand (bias rows, per-row values, scalars) equal the cpu's bits") {
  // Shapes chosen to take every path: packs of 16 bytes and single elements
  // (7 columns; a misaligned view), one row tile and many (9000 rows stride
  // over the grid), a column count past one grid's reach (2^16 + 3 single
  // elements: 256 blocks of 256 threads stride over them), and a
  // broadcast that spreads neither way (the generic kernel).
  const auto values = [](Shape shape, uint64_t seed, DType dtype) {
    const Tensor normal = ops::randn(shape, PhiloxKey{seed, 7});
    return dtype == DType::i32 ? ops::to(ops::mul(normal, 100.0), DType::i32) : ops::to(normal, dtype);
  };
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {{{64, 768}, {768}},     {{64, 768}, {64, 1}}, {{64, 768}, {}},
                                   {{9000, 8}, {8}},       {{9000, 8}, {9000, 1}}, {{5, 7}, {7}},
                                   {{5, 7}, {5, 1}},       {{(1 << 16) + 3}, {}}, {{4, 6, 10}, {6, 10}},
                                   {{4, 6, 10}, {4, 6, 1}}, {{4, 6, 10}, {6, 1}}, {{3, 1, 5}, {1, 4, 1}}};
  for (const DType dtype : {DType::f32, DType::f64, DType::i32}) {
    for (const Case& c : cases) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(c.a);
      CAPTURE(c.b);
      const Tensor a = values(c.a, 1, dtype), b = values(c.b, 2, dtype);
      const Tensor da = ops::to(a, kCuda), db = ops::to(b, kCuda);
      CHECK(same_values(ops::add(a, b), ops::add(da, db)));
      CHECK(same_values(ops::sub(b, a), ops::sub(db, da)));  // the broadcast operand on the left
      CHECK(same_values(ops::mul(a, b), ops::mul(da, db)));
      CHECK(same_values(ops::lt(a, b), ops::lt(da, db)));  // bool out, packed by the input's width
      if (dtype != DType::i32) CHECK(same_values(ops::div(b, a), ops::div(db, da)));
    }
  }
  // A misaligned dense operand and output fall back to single elements.
  const Tensor wide = ops::randn({4 * 768 + 1}, PhiloxKey{3, 7});
  const Tensor misaligned = ops::reshape(ops::slice(wide, 0, 1, 4 * 768 + 1), {4, 768});
  const Tensor bias = ops::randn({768}, PhiloxKey{4, 7});
  CHECK(same_values(ops::add(misaligned, bias), ops::add(ops::to(misaligned, kCuda), ops::to(bias, kCuda))));
  Tensor into = ops::to(wide, kCuda);
  Tensor into_view = ops::reshape(ops::slice(into, 0, 1, 4 * 768 + 1), {4, 768});
  ops::mul_(into_view, ops::to(bias, kCuda));
  Tensor expected = ops::clone(wide);
  Tensor expected_view = ops::reshape(ops::slice(expected, 0, 1, 4 * 768 + 1), {4, 768});
  ops::mul_(expected_view, bias);
  CHECK(same_values(expected, into));
  // bool operands: logic, with a per-row mask.
  const Tensor mask = ops::gt(ops::randn({64, 768}, PhiloxKey{5, 7}), 0.0);
  const Tensor row_mask = ops::gt(ops::randn({64, 1}, PhiloxKey{6, 7}), 0.0);
  CHECK(same_values(ops::mul(mask, row_mask), ops::mul(ops::to(mask, kCuda), ops::to(row_mask, kCuda))));

  // Each input byte read about once: within 1.05x of the ideal.
  for (const Shape& shape : {Shape{768}, Shape{512, 1}, Shape{}}) {
    CAPTURE(shape);
    const Tensor x = ops::randn({512, 768}, PhiloxKey{7, 7}, {.device = kCuda});
    const Tensor y = ops::randn(shape, PhiloxKey{8, 7}, {.device = kCuda});
    const std::optional<CountedBytes> counted = counted_bytes([&] { ops::add(x, y); });
    if (!counted) break;
    const int64_t ideal = (2 * x.numel() + y.numel()) * 4;
    CHECK(counted->read + counted->written >= ideal);
    CHECK(static_cast<double>(counted->read + counted->written) <= 1.05 * static_cast<double>(ideal));
  }
}

TEST_CASE("host code never touches device memory; devices do not mix; unwritten kernels say so") {
  const Tensor device = ops::ones({4}, {.device = kCuda});
  CHECK_THROWS_WITH_AS(device.data_ptr<float>(), doctest::Contains("copy it to cpu first"), Error);
  CHECK_THROWS_WITH_AS(device.raw_data(), doctest::Contains("device memory, which host code never reads"), Error);
  CHECK_THROWS_WITH_AS(ops::ones({4}).cuda_data(), doctest::Contains("not cuda"), Error);
  CHECK_THROWS_WITH_AS(ops::add(device, ops::ones({4})), doctest::Contains("operands are on different devices"), Error);
  CHECK(ops::sum(ops::matmul(ops::ones({2, 2}, {.device = kCuda}), ops::ones({2, 2}, {.device = kCuda}))).item() == 8.0);
  CHECK(ops::full({}, 2.5, {.device = kCuda}).item() == 2.5);  // item() goes through the copy API
}

TEST_CASE("memory: statistics, no device malloc in steady state, and exact bytes moved by the dense kernels") {
  const int64_t count = 1 << 16;
  const Tensor x = ops::to(ops::arange(0.0, static_cast<double>(count), 1.0), kCuda);
  const cuda::AllocatorStats before = cuda::CachingAllocator::of(0).stats();
  const MemoryStats device_stats = memory_stats(kCuda);
  CHECK(device_stats.live_bytes >= count * 4);
  for (int step = 0; step < 5; ++step) {
    const Tensor y = ops::exp(ops::neg(x));
    CHECK(memory_stats(kCuda).live_bytes == device_stats.live_bytes + count * 4);
  }
  CHECK(cuda::CachingAllocator::of(0).stats().device_mallocs <= before.device_mallocs + 1);  // the first step's segment at most
  const int64_t mallocs = cuda::CachingAllocator::of(0).stats().device_mallocs;
  for (int step = 0; step < 5; ++step) ops::exp(ops::neg(x));
  CHECK(cuda::CachingAllocator::of(0).stats().device_mallocs == mallocs);

  const std::optional<CountedBytes> counted = counted_bytes([&] { ops::neg(x); });
  if (!counted) return;
  CHECK(counted->read == count * 4);  // each input read once, with 16-byte loads
  CHECK(counted->written == count * 4);
}

TEST_CASE("transfers stage through cached pinned buffers: no page-locked allocation in steady state") {
  const Tensor host = ops::arange(0.0, 3000.0, 1.0);  // 12000 bytes of f32: the 16 KiB class
  // One round: an upload's block returns to the pool when the stream has run
  // its copy, so the download after it may need a second block of the class.
  // Whether it does depends on how fast the GPU ran the upload, so the pool
  // gets both blocks first (a warm-up round alone left one on an H100, and a
  // round later allocated the second).
  const cuda::PinnedBlock first = cuda::acquire_pinned(12000);
  const cuda::PinnedBlock second = cuda::acquire_pinned(12000);
  cuda::release_pinned(first);
  cuda::release_pinned(second);
  const auto round_trip = [&] {
    const Tensor back = ops::to(ops::to(host, kCuda), kCPU);
    CHECK(back.to_vector<float>() == host.to_vector<float>());
    const Tensor smaller = ops::to(ops::arange(0.0, 2100.0, 1.0), kCuda);  // 8400 bytes: the same class
    CHECK(ops::to(smaller, kCPU).to_vector<float>()[2099] == 2099.0f);
  };
  round_trip();
  current_stream(kCuda)->synchronize();  // every staging block is back in the pool
  const cuda::PinnedPoolStats before = cuda::pinned_pool_stats();
  CHECK(before.in_use_bytes == 0);
  for (int round = 0; round < 4; ++round) round_trip();
  current_stream(kCuda)->synchronize();
  const cuda::PinnedPoolStats after = cuda::pinned_pool_stats();
  CHECK(after.allocations == before.allocations);
  CHECK(after.reuses == before.reuses + 16);
  CHECK(after.in_use_bytes == 0);
  CHECK(after.cached_bytes >= 16384);
  // Strided and converting copies stage through the same blocks.
  const Tensor strided = ops::transpose(ops::reshape(ops::to(host, DType::f64), {60, 50}), 0, 1);
  const Tensor on_device = ops::to(strided, kCuda);
  CHECK(ops::to(on_device, kCPU).to_vector<double>() == ops::contiguous(strided).to_vector<double>());
  cuda::empty_pinned_cache();
  CHECK(cuda::pinned_pool_stats().cached_bytes == 0);
  CHECK_THROWS_WITH_AS(cuda::acquire_pinned(-1), doctest::Contains("pinned host memory: cannot hold -1 bytes"), Error);
}

TEST_CASE("random numbers on the device are the cpu's, index for index, in every floating dtype") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    for (const RandomDistribution distribution : {RandomDistribution::uniform, RandomDistribution::normal}) {
      const auto fill = [&](Device device) {
        Tensor out = ops::empty({33, 17}, {.dtype = dtype, .device = device});
        kernels(device).random(out, distribution, PhiloxKey{9, 4}, -1.0, 3.0, 1000);
        return out;
      };
      CHECK(same_values(fill(kCPU), fill(kCuda)));
    }
  }
  // A shard filled from its first index equals the rows of the whole tensor.
  Tensor whole = ops::empty({40}, {.device = kCuda}), shard = ops::empty({10}, {.device = kCuda});
  kernels(kCuda).random(whole, RandomDistribution::normal, PhiloxKey{1, 2}, 0.0, 1.0, 0);
  kernels(kCuda).random(shard, RandomDistribution::normal, PhiloxKey{1, 2}, 0.0, 1.0, 20);
  CHECK(same_values(ops::to(ops::slice(whole, 0, 20, 30), kCPU), shard));
}

TEST_CASE("reductions: max and min bit for bit, sums within one f32 rounding of the cpu's, deterministic") {
  const Tensor x = ops::randn({6, 50, 7}, PhiloxKey{3, 1});
  const Tensor device = ops::to(x, kCuda);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {2}, {0, 2}, {1, 2}}) {
    CAPTURE(dims.size());
    CHECK(same_values(ops::amax(x, dims, true), ops::amax(device, dims, true)));
    CHECK(same_values(ops::amin(x, dims, true), ops::amin(device, dims, true)));
    // Both sum f32 in f64 (each within n 2^-53 sum|x| of the exact sum), then round once to f32.
    const std::vector<float> cpu = ops::sum(x, dims, true).to_vector<float>();
    const std::vector<float> gpu = ops::sum(device, dims, true).to_vector<float>();
    const std::vector<float> magnitude = ops::sum(ops::abs(x), dims, true).to_vector<float>();
    for (size_t i = 0; i < cpu.size(); ++i) {
      CHECK(std::abs(double(cpu[i]) - double(gpu[i])) <= ulp_at<float>(cpu[i]) + 700 * 0x1p-52 * magnitude[i]);
    }
    CHECK(same_values(ops::to(ops::sum(device, dims, true), kCPU), ops::sum(device, dims, true)));  // run to run
  }
  // Integers exactly (wrapping), bool through any/all, NaN propagates, empty reductions give the identity.
  const Tensor integers = ops::arange(-100.0, 100.0, 3.0, {.dtype = DType::i64});
  CHECK(same_values(ops::sum(integers), ops::sum(ops::to(integers, kCuda))));
  const Tensor flags = ops::gt(ops::arange(0.0, 12.0, 1.0), ops::full({12}, 10.5));
  CHECK(same_values(ops::amax(flags), ops::amax(ops::to(flags, kCuda))));
  Tensor with_nan = ops::to(x, kCuda);
  Tensor one = ops::select(ops::select(ops::select(with_nan, 0, 2), 0, 3), 0, 4);
  ops::fill_(one, std::nan(""));
  CHECK(std::isnan(ops::amax(with_nan).item()));
  CHECK(ops::sum(ops::empty({0, 3}, {.device = kCuda}), {0}).to_vector<float>() == std::vector<float>{0, 0, 0});
}

TEST_CASE("max_along, index_select and the deterministic index_add equal the cpu's bits") {
  const Tensor x = ops::randn({5, 9, 4}, PhiloxKey{8, 2});
  const Tensor device = ops::to(x, kCuda);
  for (int64_t dim = 0; dim < 3; ++dim) {
    Shape shape = x.sizes();
    shape[dim] = 1;
    Tensor values = ops::empty(shape), indices = ops::empty(shape, {.dtype = DType::i64});
    Tensor device_values = ops::empty(shape, {.device = kCuda}),
           device_indices = ops::empty(shape, {.dtype = DType::i64, .device = kCuda});
    kernels(kCPU).max_along(values, indices, x, dim);
    kernels(kCuda).max_along(device_values, device_indices, device, dim);
    CHECK(same_values(values, device_values));
    CHECK(same_values(indices, device_indices));
  }
  std::vector<int64_t> rows = {3, 0, 3, 8, 1, 3, 0};
  const Tensor index = host_tensor(rows);
  const Tensor device_index = ops::to(index, kCuda);
  CHECK(same_values(ops::index_select(x, 1, index), ops::index_select(device, 1, device_index)));
  // Duplicate rows accumulate in index order on both devices.
  const Tensor source = ops::randn({5, 7, 4}, PhiloxKey{8, 3});
  Tensor cpu_out = ops::clone(x), gpu_out = ops::to(x, kCuda);
  kernels(kCPU).index_add(cpu_out, 1, index, source);
  kernels(kCuda).index_add(gpu_out, 1, device_index, ops::to(source, kCuda));
  CHECK(same_values(cpu_out, gpu_out));
}

TEST_CASE("gradcheck of the differentiable ops on cuda tensors, in f64") {
  const auto leaf = [](const Shape& shape, uint64_t stream, double low, double high) {
    Tensor values = ops::rand(shape, PhiloxKey{77, stream}, {.dtype = DType::f64});
    values = ops::add(ops::mul(values, ops::full({}, high - low, {.dtype = DType::f64})),
                      ops::full({}, low, {.dtype = DType::f64}));
    Tensor on_device = ops::to(values, kCuda);
    on_device.set_requires_grad(true);
    return on_device;
  };
  const Tensor a = leaf({3, 4}, 1, 0.5, 2.0), b = leaf({3, 4}, 2, 0.5, 2.0), c = leaf({4}, 3, -1.0, 1.0);
  const Tensor rows = ops::to(host_tensor(std::vector<int64_t>{2, 0, 2, 1}), kCuda);
  using autograd::TensorList;
  using Function = std::function<Tensor(const TensorList&)>;
  const std::vector<std::pair<const char*, Function>> functions = {
      {"exp, log, sqrt, rsqrt", [](const TensorList& t) { return add(add(exp(t[0]), log(t[0])), add(sqrt(t[0]), rsqrt(t[0]))); }},
      {"tanh, sigmoid, neg", [](const TensorList& t) { return neg(mul(tanh(t[0]), sigmoid(t[1]))); }},
      {"gelu (both), silu, relu", [](const TensorList& t) {
         return add(add(gelu(t[2], GeluApproximation::tanh), gelu(t[2], GeluApproximation::none)), add(silu(t[2]), relu(t[2])));
       }},
      {"add, sub, mul, div, pow with broadcast", [](const TensorList& t) {
         return pow(div(sub(mul(t[0], t[1]), t[2]), add(t[1], t[2])), ops::full({}, 2.0, {.dtype = DType::f64, .device = t[0].device()}));
       }},
      {"where", [](const TensorList& t) { return where(ops::gt(t[0], t[1]), t[0], mul(t[1], t[1])); }},
      {"sum, mean over dims, transpose, expand", [](const TensorList& t) {
         return add(sum(transpose(t[0], 0, 1), {1}, true), mean(expand(t[2], {3, 4}), {0}));
       }},
      {"index_select (and index_add in backward)", [&rows](const TensorList& t) { return index_select(t[0], 0, rows); }},
  };
  for (const auto& [name, function] : functions) {
    CAPTURE(name);
    const autograd::GradcheckResult result = autograd::gradcheck(function, {a, b, c});
    CHECK_MESSAGE(result.ok, result.report);
  }
}

TEST_CASE("an index out of range on the device is raised at the next read, and touches no memory meanwhile") {
  const Tensor table = ops::to(ops::randn({5, 3}, PhiloxKey{4, 4}), kCuda);
  const Tensor bad = ops::to(host_tensor(std::vector<int64_t>{1, 7, 2}), kCuda);
  // Queued without a synchronisation: the gather skips the bad row (zeros).
  const Tensor gathered = ops::index_select(table, 0, bad);
  CHECK_THROWS_WITH_AS(gathered.to_vector<float>(),
                       doctest::Contains("index_select: index 7 at position 1 is out of range for dim 0 of size 5"),
                       Error);
  // Raised once: the stream's next read is clean, and the bad row read nothing.
  const std::vector<float> rows = gathered.to_vector<float>();
  CHECK(rows[3] == 0.0f);
  CHECK(rows[4] == 0.0f);
  CHECK(rows[5] == 0.0f);
  const Tensor good = ops::to(host_tensor(std::vector<int64_t>{4, 0}), kCuda);
  CHECK(same_values(ops::index_select(ops::to(table, kCPU), 0, ops::to(good, kCPU)), ops::index_select(table, 0, good)));
  // The scatter-add skips it too, and cross-entropy's targets are checked the same way.
  Tensor sums = ops::zeros({5, 3}, {.device = kCuda});
  ops::index_add_(sums, 0, bad, ops::ones({3, 3}, {.device = kCuda}));
  CHECK_THROWS_WITH_AS(sums.to_vector<float>(), doctest::Contains("out of range"), Error);
  CHECK(ops::sum(sums).item() == 6.0);
  const Tensor logits = ops::zeros({2, 4}, {.device = kCuda});
  const Tensor targets = ops::to(host_tensor(std::vector<int64_t>{3, 9}), kCuda);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, targets).item(),
                       doctest::Contains("target 9 out of range for 4 classes"), Error);
}
