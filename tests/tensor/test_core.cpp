// The tensor layer's foundations: dtypes and their conversions, devices,
// storage statistics, Philox streams, CPU streams and events, and the cuda
// device in a build without its runtime.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <set>

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/host_staging.h"
#include "tensor/kernels.h"
#include "tensor/philox.h"
#include "tensor/portable_math.h"
#include "tensor/storage.h"
#include "tensor/stream.h"

using namespace tessera;

TEST_CASE("dtype properties and promotion") {
  CHECK(element_size(DType::f32) == 4);
  CHECK(element_size(DType::bf16) == 2);
  CHECK(element_size(DType::i64) == 8);
  CHECK(element_size(DType::boolean) == 1);
  CHECK(dtype_from_name("bf16") == DType::bf16);
  CHECK_THROWS_WITH_AS(dtype_from_name("f8"), doctest::Contains("unknown dtype 'f8'"), Error);
  CHECK(promote_types(DType::i32, DType::f32) == DType::f32);
  CHECK(promote_types(DType::bf16, DType::f16) == DType::f32);
  CHECK(promote_types(DType::i64, DType::i32) == DType::i64);
  CHECK(promote_types(DType::boolean, DType::i32) == DType::i32);
  CHECK(promote_types(DType::bf16, DType::f64) == DType::f64);
  CHECK(compute_dtype(DType::f16) == DType::f32);
}

TEST_CASE("bf16 rounds to nearest even") {
  CHECK(static_cast<float>(BFloat16(1.0f)) == 1.0f);
  // 1 + 2^-8 lies exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  CHECK(static_cast<float>(BFloat16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(static_cast<float>(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  // Just above the halfway point rounds up.
  CHECK(static_cast<float>(BFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))) ==
        1.0f + std::ldexp(1.0f, -7));
  CHECK(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(static_cast<float>(BFloat16(std::numeric_limits<float>::infinity()))));
  CHECK(static_cast<float>(BFloat16(-2.5f)) == -2.5f);
}

TEST_CASE("f16 conversions: exact values, ties to even, subnormals, overflow") {
  for (float value : {0.0f, 1.0f, -1.5f, 65504.0f, 0.333251953125f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24)}) {
    CHECK(static_cast<float>(Half(value)) == value);
  }
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  CHECK(static_cast<float>(Half(1.0f + std::ldexp(1.0f, -11))) == 1.0f);
  CHECK(static_cast<float>(Half(1.0f + 3 * std::ldexp(1.0f, -11))) == 1.0f + std::ldexp(1.0f, -9));
  // Subnormal: 3 * 2^-25 is halfway between 2^-24 (odd) and 2^-23 (even).
  CHECK(static_cast<float>(Half(3 * std::ldexp(1.0f, -25))) == std::ldexp(1.0f, -23));
  CHECK(static_cast<float>(Half(std::ldexp(1.0f, -25))) == 0.0f);  // tie between 0 and 2^-24 goes to 0
  CHECK(std::isinf(static_cast<float>(Half(65520.0f))));           // rounds past the largest finite half
  CHECK(static_cast<float>(Half(65519.0f)) == 65504.0f);
  CHECK(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  // Every finite half survives half -> float -> half.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7c00u) == 0x7c00u) continue;
    float value = float16_bits::float_from_half(static_cast<uint16_t>(bits));
    REQUIRE(float16_bits::half_from_float(value) == bits);
  }
}

TEST_CASE("device parsing and names") {
  CHECK(Device::parse("cpu") == kCPU);
  CHECK(Device::parse("meta").is_meta());
  CHECK(Device::parse("cuda:3") == Device(DeviceType::cuda, 3));
  CHECK(Device(DeviceType::cuda, 1).str() == "cuda:1");
  CHECK_THROWS_WITH_AS(Device::parse("cuda:x"), doctest::Contains("unknown device 'cuda:x'"), Error);
  CHECK_THROWS_AS(Device::parse("tpu"), Error);
}

TEST_CASE("storage statistics: live, peak, count, reset") {
  const MemoryStats before = memory_stats(kCPU);
  {
    auto block = allocate(kCPU, 1000);
    CHECK(reinterpret_cast<uintptr_t>(block->data()) % 64 == 0);
    const MemoryStats during = memory_stats(kCPU);
    CHECK(during.live_bytes == before.live_bytes + 1000);
    CHECK(during.allocation_count == before.allocation_count + 1);
    CHECK(during.peak_bytes >= during.live_bytes);
  }
  CHECK(memory_stats(kCPU).live_bytes == before.live_bytes);
  reset_peak_memory(kCPU);
  CHECK(memory_stats(kCPU).peak_bytes == memory_stats(kCPU).live_bytes);
  // Meta allocations hold no bytes.
  auto meta = allocate(kMeta, 1 << 20);
  CHECK(meta->data() == nullptr);
  CHECK(meta->bytes() == 0);
#if TESSERA_HAVE_CUDA
  CHECK(allocate(Device(DeviceType::cuda, 0), 16)->device().is_cuda());  // the cuda device: tests/cuda
#else
  CHECK_THROWS_WITH_AS(allocate(Device(DeviceType::cuda, 0), 16), doctest::Contains("cuda:0"), Error);
#endif
  CHECK_THROWS_AS(allocate(kCPU, -1), Error);
}

TEST_CASE("large freed blocks are cached for reuse, outside live and peak bytes") {
  release_cached_memory(kCPU);
  CHECK(memory_stats(kCPU).cached_bytes == 0);
  const int64_t live_before = memory_stats(kCPU).live_bytes;
  void* first_address = nullptr;
  {
    auto block = allocate(kCPU, 5 << 20);
    first_address = block->data();
    CHECK(reinterpret_cast<uintptr_t>(first_address) % (2 << 20) == 0);  // huge-page aligned
  }
  CHECK(memory_stats(kCPU).live_bytes == live_before);
  CHECK(memory_stats(kCPU).cached_bytes == 6 << 20);  // rounded up to whole 2 MiB pages
  {
    auto again = allocate(kCPU, (5 << 20) + 123);  // same rounded size: the cached block comes back
    CHECK(again->data() == first_address);
    CHECK(memory_stats(kCPU).cached_bytes == 0);
    auto larger = allocate(kCPU, 20 << 20);  // nothing cached fits: a new block
    CHECK(larger->data() != first_address);
  }
  CHECK(memory_stats(kCPU).cached_bytes == (6 << 20) + (20 << 20));
  {
    auto small_request = allocate(kCPU, 3 << 20);  // takes the 6 MiB block (at most 2x the request)
    CHECK(small_request->data() == first_address);
  }
  release_cached_memory(kCPU);
  CHECK(memory_stats(kCPU).cached_bytes == 0);
}

TEST_CASE("memory scopes charge allocations to the thread that made them") {
  auto counters = std::make_shared<MemoryCounters>();
  std::shared_ptr<Storage> kept;
  {
    MemoryScope scope(counters);
    kept = allocate(kCPU, 4096);
    auto transient = allocate(kCPU, 100);
  }
  auto outside = allocate(kCPU, 777);  // not charged: the scope is closed
  CHECK(counters->snapshot().live_bytes == 4096);
  CHECK(counters->snapshot().peak_bytes == 4196);
  CHECK(counters->snapshot().allocation_count == 2);
  kept.reset();  // credited back to the scope that was charged
  CHECK(counters->snapshot().live_bytes == 0);
}

TEST_CASE("Philox: known answer, counter purity, stream independence") {
  // Known-answer vector from the Random123 distribution (philox4x32_10, zero key, zero counter).
  auto zero = philox4x32(PhiloxKey{0, 0}, 0);
  CHECK(zero[0] == 0x6627e8d5u);
  CHECK(zero[1] == 0xe169c58du);
  CHECK(zero[2] == 0xbc57ac4cu);
  CHECK(zero[3] == 0x9b00dbd8u);
  auto ones = philox4x32(PhiloxKey{~0ull, ~0ull}, ~0ull);
  CHECK(ones == std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  const PhiloxKey key{42, 7};
  CHECK(philox_uniform(key, 123456) == philox_uniform(key, 123456));
  CHECK(philox_uniform(key, 1) != philox_uniform(key, 2));
  CHECK(philox_uniform(key, 1) != philox_uniform(PhiloxKey{42, 8}, 1));
  double sum = 0.0, sum_sq = 0.0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double u = philox_uniform(key, static_cast<uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    double z = philox_normal(key, static_cast<uint64_t>(i));
    sum += z;
    sum_sq += z * z;
  }
  CHECK(std::abs(sum / n) < 0.03);
  CHECK(std::abs(sum_sq / n - 1.0) < 0.05);
  CHECK(stream_id_for("blocks.0.attn.qkv.weight") != stream_id_for("blocks.1.attn.qkv.weight"));
  Generator generator(5);
  CHECK(generator.next_key().stream == 0);
  CHECK(generator.next_key().stream == 1);
  generator.manual_seed(9);
  CHECK(generator.next_key().stream == 0);
}

TEST_CASE("Box-Muller's log and cosine: within 1 and 2 ulp of long double's, and the same bits everywhere") {
  // Every argument Box-Muller can pass is a multiple of 2^-32: sample them,
  // with the ends and the quarter turns.
  std::mt19937_64 random(11);
  std::vector<uint64_t> numerators = {0, 1, 2, 3, 1ull << 30, 1ull << 31, 3ull << 30, (1ull << 32) - 1, 1ull << 32};
  while (numerators.size() < 200000) numerators.push_back(random() >> 32);
  double worst_log = 0.0, worst_cos = 0.0;
  const auto ulps = [](double got, long double exact) {
    if (exact == 0.0L) return got == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
    const int exponent = std::ilogb(static_cast<double>(exact));
    return static_cast<double>(std::fabs(static_cast<long double>(got) - exact) / std::ldexp(1.0L, exponent - 52));
  };
  for (const uint64_t numerator : numerators) {
    const double u = static_cast<double>(numerator) * 0x1p-32;
    if (numerator > 0) worst_log = std::max(worst_log, ulps(portable_math::log(u), std::log(static_cast<long double>(u))));
    if (numerator < (1ull << 32)) {
      // cos(2 pi u) = cos(pi/2 (q + t)) = +-cos or +-sin of pi/2 t, and of pi/2 (1 - t)
      // past t = 1/2: reduced so that long double's pi, rounded, keeps its
      // relative accuracy at the zeros of the cosine.
      const long double half_pi = std::numbers::pi_v<long double> / 2;
      const uint64_t quarter = numerator >> 30;
      const long double t = static_cast<long double>(numerator & ((1ull << 30) - 1)) * 0x1p-30L;
      const bool sine = (quarter % 2 == 1) != (t > 0.5L);
      const long double angle = half_pi * (t > 0.5L ? 1.0L - t : t);
      const long double magnitude = sine ? std::sin(angle) : std::cos(angle);
      const long double exact = quarter == 1 || quarter == 2 ? -magnitude : magnitude;
      worst_cos = std::max(worst_cos, ulps(portable_math::cos_of_turns(u), exact));
    }
  }
  MESSAGE("portable log: worst ", worst_log, " ulp; cos of turns: worst ", worst_cos, " ulp");
  // The quarter turns exactly, and an eighth within an ulp.
  CHECK(portable_math::cos_of_turns(0.0) == 1.0);
  CHECK(portable_math::cos_of_turns(0.25) == 0.0);
  CHECK(portable_math::cos_of_turns(0.5) == -1.0);
  CHECK(portable_math::cos_of_turns(0.75) == 0.0);
  CHECK(std::fabs(portable_math::cos_of_turns(0.125) - std::numbers::sqrt2 / 2) <= 0x1p-53);
  CHECK(std::fabs(portable_math::cos_of_turns(0.875) - std::numbers::sqrt2 / 2) <= 0x1p-53);
  CHECK(portable_math::log(1.0) == 0.0);
  CHECK(portable_math::log(0.5) == -std::numbers::ln2);
  CHECK(worst_log <= 1.0);
  CHECK(worst_cos <= 2.0);
  // The bits themselves, which no libm or instruction set may change.
  const PhiloxKey key{2026, 11};
  const double expected[4] = {-0x1.3c0c8af79f15bp+0, 0x1.ab95913c0fbebp-1, 0x1.5fc4316f9c048p-2, 0x1.f195203ac3e93p-1};
  for (int i = 0; i < 4; ++i) CHECK(philox_normal(key, static_cast<uint64_t>(i)) == expected[i]);
}

TEST_CASE("streams run tasks in order, concurrently with the caller; events mark progress") {
  auto stream = Stream::create(kCPU);
  std::vector<int> order;
  std::atomic<bool> release{false};
  stream->enqueue([&] {
    while (!release.load()) std::this_thread::yield();
    order.push_back(1);
  });
  stream->enqueue([&] { order.push_back(2); });
  Event event;
  event.record(*stream);
  CHECK_FALSE(event.query());  // the first task is still blocked: enqueue did not wait
  release = true;
  event.synchronize();
  CHECK(event.query());
  CHECK(order == std::vector<int>{1, 2});

  // A second stream waits on an event of the first.
  auto other = Stream::create(kCPU);
  std::atomic<bool> gate{false};
  std::atomic<int> seen{0};
  stream->enqueue([&] {
    while (!gate.load()) std::this_thread::yield();
  });
  Event first_done;
  first_done.record(*stream);
  other->wait_event(first_done);
  other->enqueue([&] { seen = 1; });
  gate = true;
  other->synchronize();
  CHECK(seen == 1);
}

TEST_CASE("stream errors surface at synchronize; the default stream runs inline") {
  auto stream = Stream::create(kCPU);
  stream->enqueue([] { throw Error("task failed on purpose"); });
  CHECK_THROWS_WITH_AS(stream->synchronize(), "task failed on purpose", Error);
  stream->synchronize();  // the error is reported once
  int value = 0;
  Stream::default_stream(kCPU)->enqueue([&] { value = 7; });
  CHECK(value == 7);
#if TESSERA_HAVE_CUDA_SIM
  CHECK(Stream::create(Device(DeviceType::cuda))->device().is_cuda());  // the simulator's streams: tests/cuda
#else
  CHECK_THROWS_WITH_AS(Stream::create(Device(DeviceType::cuda)), doctest::Contains("no cuda runtime"), Error);
#endif
}

// The cuda device's runtime table in a build without a cuda runtime
// (tensor/no_cuda_runtime.cpp): what needs the device names it and how to
// configure a build that has one; what only asks about it finds nothing.
TEST_CASE("without a cuda runtime, the cuda device's errors say how to configure one" *
          doctest::skip(TESSERA_HAVE_CUDA != 0)) {
  const Device cuda(DeviceType::cuda, 3);
  CHECK_THROWS_WITH_AS(describe_device(cuda),
                       "cuda:3: this build has no cuda runtime (configure with the CUDA toolkit: -Dgpu_runtime=sim, "
                       "the default, or -Dgpu_runtime=nvidia)",
                       Error);
  CHECK_THROWS_WITH_AS(allocate(cuda, 16),
                       "allocate: no allocator for device cuda:3 in this build (configure with the CUDA toolkit for "
                       "the cuda device)",
                       Error);
  CHECK_THROWS_WITH_AS(Storage::released(cuda, 16)->restore_data(),
                       doctest::Contains("Storage::restore_data: no allocator for device cuda:3"), Error);
  CHECK_THROWS_WITH_AS(Stream::default_stream(cuda),
                       "Stream: no cuda runtime in this build (configure with the CUDA toolkit for the simulator)",
                       Error);
  CHECK_THROWS_WITH_AS(kernels(cuda),
                       "kernels: no kernels for cuda:3 in this build (configure on a machine with the CUDA toolkit "
                       "and Boost.Context)",
                       Error);
  CHECK(memory_stats(cuda).cached_bytes == 0);
  release_cached_memory(cuda);
  // Host staging: ordinary memory, no copies, nothing to check.
  const Tensor host = pinned_empty({4}, DType::f32);
  CHECK(host.device().is_cpu());
  check_host_access(host, /*writes=*/true, "a test");
  const Tensor other = pinned_empty({4}, DType::f32);
  CHECK_THROWS_WITH_AS(copy_to_host_async(host, other, *Stream::default_stream(kCPU)),
                       "copy_to_host_async: cpu is not a device of this build", Error);
  CHECK_THROWS_WITH_AS(copy_from_host_async(other, host, *Stream::default_stream(kCPU)),
                       "copy_from_host_async: cpu is not a device of this build", Error);
}
