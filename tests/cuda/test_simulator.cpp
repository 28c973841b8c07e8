// The SIMT simulator runs CUDA kernels with the hardware's semantics (blocks,
// warps, barriers, shuffles, votes, atomics, shared memory, launch limits) and
// catches what the hardware would not tell: shared-memory races, out-of-bounds
// and undeclared device accesses, divergent barriers and warp operations that
// can never complete.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "tensor/cuda/sim/architecture.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/float16_bits.h"
#include "tensor/stream.h"
#include "tests/cuda/device_buffer.h"
#include "tests/cuda/expected_error.h"
#include "tests/cuda/simulator_kernels.h"

using namespace tessera;
namespace sim = tessera::cuda::sim;
using tessera::testing::contains;
using tessera::testing::error_of;
using namespace tessera::float16_bits;

namespace {

// Kernels carry the simulator's instrumentation unless AddressSanitizer
// instruments them instead (-Db_sanitize=address; GCC allows one of the two).
constexpr bool kSimChecks = TESSERA_SIM_CHECKS != 0;


std::vector<float> iota_floats(size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 97) * 0.5f;
  return values;
}

}  // namespace

TEST_CASE("a shared-memory tree reduction with barriers sums each block exactly") {
  const int blocks = 7, threads = 256;
  const std::vector<float> values = iota_floats(blocks * threads);
  DeviceBuffer<float> in(values), out(blocks);
  simulator_kernels::block_sums(in.get(), out.get(), blocks, threads);
  const std::vector<float> sums = out.read();
  for (int block = 0; block < blocks; ++block) {
    // Halves of 0.5 with at most 8 bits of integer part: every partial sum is exact in f32.
    const float expected = std::accumulate(values.begin() + block * threads, values.begin() + (block + 1) * threads, 0.0f);
    CHECK(sums[block] == expected);
  }
}

TEST_CASE("warps of 32 act together: __shfl_down_sync reduces each warp") {
  const int warps = 12;  // 3 blocks of 4 warps
  const std::vector<float> values = iota_floats(warps * 32);
  DeviceBuffer<float> in(values), out(warps);
  simulator_kernels::warp_sums(in.get(), out.get(), warps);
  const std::vector<float> sums = out.read();
  for (int warp = 0; warp < warps; ++warp) {
    CHECK(sums[warp] == std::accumulate(values.begin() + warp * 32, values.begin() + (warp + 1) * 32, 0.0f));
  }
}

TEST_CASE("__shfl_sync, __shfl_up_sync and __shfl_xor_sync with a width follow CUDA's lane rules") {
  const int warps = 3;
  std::vector<int> values(warps * 32);
  std::iota(values.begin(), values.end(), 100);
  DeviceBuffer<int> in(values), out(warps * 96);
  simulator_kernels::warp_shuffles(in.get(), out.get(), warps);
  const std::vector<int> result = out.read();
  for (int i = 0; i < warps * 32; ++i) {
    const int lane = i % 32, base = i - lane;
    CAPTURE(i);
    CHECK(result[3 * i] == values[base + (lane + 1) % 32]);         // rotate by one
    CHECK(result[3 * i + 1] == values[lane == 0 ? i : i - 1]);       // lane 0 keeps its own value
    CHECK(result[3 * i + 2] == values[base + (lane ^ 1)]);           // pairs swap within 16-lane segments
  }
}

TEST_CASE("__ballot_sync, __any_sync and __all_sync") {
  std::vector<int> values(64, 1);
  values[3] = 0;
  values[17] = -1;  // warp 0: lanes 3 and 17 not positive; warp 1: all positive
  DeviceBuffer<int> in(values);
  DeviceBuffer<unsigned> out(6);
  simulator_kernels::warp_votes(in.get(), out.get(), 2);
  const std::vector<unsigned> votes = out.read();
  CHECK(votes[0] == (0xffffffffu & ~(1u << 3) & ~(1u << 17)));
  CHECK(votes[1] == 1u);
  CHECK(votes[2] == 0u);
  CHECK(votes[3] == 0xffffffffu);
  CHECK(votes[4] == 1u);
  CHECK(votes[5] == 1u);
}

TEST_CASE("atomics on shared and device memory count every update") {
  const int n = 1000, bins = 16;
  std::vector<int> values(n);
  for (int i = 0; i < n; ++i) values[i] = (i * 7) % bins;
  DeviceBuffer<int> in(values), counts(std::vector<int>(bins, 0));
  DeviceBuffer<float> total(std::vector<float>{0.0f});
  simulator_kernels::histogram(in.get(), n, counts.get(), bins, total.get());
  std::vector<int> expected(bins, 0);
  for (int value : values) ++expected[value];
  CHECK(counts.read() == expected);
  CHECK(total.read()[0] == static_cast<float>(std::accumulate(values.begin(), values.end(), 0)));  // < 2^24: exact
}

TEST_CASE("the simulator's checks are on unless AddressSanitizer instruments the kernels") {
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool address_sanitizer = true;
#else
  constexpr bool address_sanitizer = false;
#endif
  CHECK(kSimChecks == !address_sanitizer);
  if (!kSimChecks) {
    MESSAGE("racecheck and memcheck are off in this build: its kernels carry AddressSanitizer's instrumentation "
            "instead of the simulator's; the cases that need them are skipped");
  }
}

TEST_CASE("dynamic shared memory, and a launch on a stream surfaces at synchronize" * doctest::skip(!kSimChecks)) {
  const int n = 200;
  const std::vector<float> values = iota_floats(n);
  DeviceBuffer<float> in(values), out(n);
  const std::shared_ptr<Stream> stream = Stream::create(Device(DeviceType::cuda));
  simulator_kernels::reverse_in_shared(in.get(), out.get(), n, stream.get());
  stream->synchronize();
  std::vector<float> reversed(values.rbegin(), values.rend());
  CHECK(out.read() == reversed);

  DeviceBuffer<float> small(10);
  simulator_kernels::write_past_end(small.get(), 10, stream.get());  // returns at once; the fault is the stream's
  const std::string message = error_of([&] { stream->synchronize(); });
  CHECK(contains(message, "write_past_end_kernel"));
  CHECK_NOTHROW(stream->synchronize());  // reported once
}

TEST_CASE("float4 loads and the toolkit's bf16/f16 arithmetic round as tessera's conversions do") {
  // Specials, ties and overflow past f16's 65504 first, then random floats over many binades.
  std::vector<float> in = {0.0f, -0.0f, 1.0f / 0.0f, -1.0f / 0.0f, std::nanf(""), 1e-45f, -3e-39f, 65504.0f,
                           65520.0f, 1e5f, 1.00390625f, 1.01171875f, 3.0f, 1.0f / 3.0f, -2.5f, 7e-8f};
  std::mt19937 random(7);
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f), sign(-1.0f, 1.0f);
  while (in.size() < 4096) in.push_back(std::copysign(std::exp2(exponent(random)), sign(random)));
  const int quads = static_cast<int>(in.size() / 4);
  DeviceBuffer<float> device_in(in);
  DeviceBuffer<__nv_bfloat16> bf16_out(3 * quads);
  DeviceBuffer<__half> half_out(3 * quads);
  simulator_kernels::sixteen_bit_floats(device_in.get(), bf16_out.get(), half_out.get(), quads);
  const std::vector<__nv_bfloat16> bf16 = bf16_out.read();
  const std::vector<__half> half = half_out.read();
  const auto bits = [](auto value) {
    uint16_t word;
    std::memcpy(&word, &value, 2);
    return word;
  };
  // NaNs compare as NaN; the payload is the conversion's choice.
  const auto same = [](uint16_t got, uint16_t expected, float (*to_float)(uint16_t)) {
    return std::isnan(to_float(expected)) ? std::isnan(to_float(got)) : got == expected;
  };
  int mismatches = 0;
  for (int i = 0; i < quads; ++i) {
    const float x = in[4 * i], y = in[4 * i + 1], z = in[4 * i + 2], w = in[4 * i + 3];
    const uint16_t bx = bfloat16_from_float(x), by = bfloat16_from_float(y);
    const uint16_t hz = half_from_float(z), hw = half_from_float(w);
    const uint16_t expected[6] = {
        bx, bfloat16_from_float(float_from_bfloat16(bx) * float_from_bfloat16(by)), static_cast<uint16_t>(by ^ 0x8000),
        hz, half_from_float(float_from_half(hz) * float_from_half(hw)),            hw};
    for (int k = 0; k < 3; ++k) {
      mismatches += !same(bits(bf16[3 * i + k]), expected[k], float_from_bfloat16);
      mismatches += !same(bits(half[3 * i + k]), expected[3 + k], float_from_half);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("3-D grids of 3-D blocks see CUDA's coordinates") {
  const int count = 3 * 2 * 2 * 4 * 2 * 3;
  DeviceBuffer<int> out(count);
  simulator_kernels::coordinates(out.get(), 3, 2, 2, 4, 2, 3);
  std::vector<int> expected(count);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(out.read() == expected);
}

TEST_CASE("blocks run in a seeded random order") {
  const int blocks = 64;
  const auto order = [&](uint64_t seed) {
    sim::set_block_order_seed(seed);
    DeviceBuffer<int> out(blocks), counter(std::vector<int>{0});
    simulator_kernels::block_order(out.get(), counter.get(), blocks);
    return out.read();
  };
  const std::vector<int> first = order(1), again = order(1), other = order(2);
  CHECK(first == again);  // setting the seed restarts the sequence of orders
  std::vector<int> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> all(blocks);
  std::iota(all.begin(), all.end(), 0);
  CHECK(sorted == all);  // every block ran once
  CHECK(first != all);   // not in index order
  CHECK(first != other);
}

TEST_CASE("racecheck: two threads writing one shared word between barriers" * doctest::skip(!kSimChecks)) {
  DeviceBuffer<float> out(1);
  const std::string message = error_of([&] { simulator_kernels::race_on_shared(out.get()); });
  CHECK(contains(message, "racecheck"));
  CHECK(contains(message, "race_on_shared_kernel"));
  CHECK(contains(message, "write-after-write"));
  CHECK(contains(message, "thread (1,0,0)"));
  CHECK(contains(message, "thread (0,0,0)"));
}

TEST_CASE("racecheck: a tree reduction without its __syncthreads" * doctest::skip(!kSimChecks)) {
  const int threads = 128;
  DeviceBuffer<float> in(iota_floats(threads)), out(1);
  const std::string message = error_of([&] { simulator_kernels::reduction_missing_barrier(in.get(), out.get(), threads); });
  CHECK(contains(message, "racecheck"));
  CHECK(contains(message, "reduction_missing_barrier_kernel"));
  // Thread 0 runs its whole loop first and reads partial[1]; thread 1 then writes it.
  CHECK(contains(message, "write-after-read hazard on dynamic shared memory at byte 4"));
  CHECK(contains(message, "thread (1,0,0) at tests/cuda/simulator_kernels.cu:110 writes it, and thread (0,0,0) "
                          "accessed it earlier at tests/cuda/simulator_kernels.cu:110"));
  // With the barrier the same tree is race-free (the block_sums case).
}

TEST_CASE("__syncwarp orders lanes of one warp for racecheck") {
  DeviceBuffer<int> out(32);
  simulator_kernels::syncwarp_orders_lanes(out.get());
  const std::vector<int> values = out.read();
  for (int lane = 0; lane < 32; ++lane) CHECK(values[lane] == ((lane + 31) % 32 + 1) % 32 * 10 + 1);
}

TEST_CASE("a barrier that not every thread reaches is an error naming the kernel and the barrier") {
  DeviceBuffer<float> out(32);
  std::string message = error_of([&] { simulator_kernels::divergent_barrier(out.get()); });
  CHECK(contains(message, "divergent_barrier_kernel"));
  CHECK(contains(message, "divergent barrier"));
  CHECK(contains(message, "reached by 16 of 32 threads"));
  CHECK(contains(message, "simulator_kernels.cu:"));

  message = error_of([&] { simulator_kernels::barriers_at_two_sites(out.get()); });
  CHECK(contains(message, "barriers_at_two_sites_kernel"));
  CHECK(contains(message, "can never finish"));
  CHECK(contains(message, "16 threads ((0,0,0) to (30,0,0)) wait at __syncthreads()"));
}

TEST_CASE("memcheck: out-of-bounds, undeclared and read-only violations name the kernel, thread and buffer" * doctest::skip(!kSimChecks)) {
  DeviceBuffer<float> out(100);
  std::string message = error_of([&] { simulator_kernels::write_past_end(out.get(), 100, nullptr); });
  CHECK(contains(message, "memcheck"));
  CHECK(contains(message, "write_past_end_kernel"));
  CHECK(contains(message, "thread (36,0,0)"));  // i = 100 is thread 36 of block 1
  CHECK(contains(message, "block (1,0,0)"));
  CHECK(contains(message, "past the end of the 400-byte allocation"));

  DeviceBuffer<float> declared(32), undeclared(32), result(32);
  message = error_of([&] { simulator_kernels::read_undeclared(declared.get(), undeclared.get(), result.get()); });
  CHECK(contains(message, "outside every buffer the launch declared"));

  message = error_of([&] { simulator_kernels::write_read_only(declared.get()); });
  CHECK(contains(message, "writes buffer `in`, which the launch declared read-only"));

  message = error_of([&] { simulator_kernels::shared_overflow(result.get(), 64); });
  CHECK(contains(message, "past the 64 bytes the launch configured"));
}

TEST_CASE("warp operations: disagreeing masks and exited lanes are errors, not hangs") {
  DeviceBuffer<int> out(32);
  std::string message = error_of([&] { simulator_kernels::shuffle_mask_mismatch(out.get()); });
  CHECK(contains(message, "shuffle_mask_mismatch_kernel"));
  CHECK(contains(message, "disagree"));

  // Lanes that exited complete a full-mask shuffle (test_fidelity.cpp); a
  // lane that never arrives, stuck at another operation, does not.
  message = error_of([&] { simulator_kernels::shuffle_exited_lane(out.get()); });
  CHECK(contains(message, "can never finish"));
  CHECK(contains(message, "__shfl_sync(mask 0xffffffff)"));
  CHECK(contains(message, "16 threads ((16,0,0) to (31,0,0)) wait at __syncthreads()"));
}

TEST_CASE("launch limits are the architecture's") {
  DeviceBuffer<float> out(1056);
  std::string message = error_of([&] { simulator_kernels::too_many_threads(out.get()); });
  CHECK(contains(message, "1056 threads per block, above sm_90's 1024"));
  message = error_of([&] { simulator_kernels::too_much_shared(out.get(), false); });
  CHECK(contains(message, "65536 bytes of dynamic shared memory, above the 49152"));
  CHECK_NOTHROW(simulator_kernels::too_much_shared(out.get(), true));
  sim::set_target_architecture(sim::architecture_named("sm_80"));
  CHECK_NOTHROW(simulator_kernels::too_much_shared(out.get(), true));
  sim::set_target_architecture(sim::sm_90());
  CHECK_THROWS_WITH_AS(sim::architecture_named("sm_75"), doctest::Contains("sm_80, sm_90 or sm_100"), Error);
  CHECK_THROWS_WITH_AS(simulator_kernels::block_sums(out.get(), reinterpret_cast<float*>(out.get()) + 0, 0, 32),
                       doctest::Contains("grid (0,1,1) is outside"), Error);
  CHECK_THROWS_WITH_AS(simulator_kernels::coordinates(reinterpret_cast<int*>(out.get()), 1 << 20, 32, 1, 1, 1, 1),
                       doctest::Contains("the simulator runs at most 16777216 per launch"), Error);
  float host[32];
  CHECK_THROWS_WITH_AS(simulator_kernels::write_read_only(host), doctest::Contains("is not live device memory"), Error);
}

TEST_CASE("static __shared__ memory counts against the block's limits" * doctest::skip(!kSimChecks)) {
  DeviceBuffer<float> out(2);
  CHECK_NOTHROW(simulator_kernels::static_shared(out.get(), 12288, 0, false));  // exactly 48 KiB
  std::string message = error_of([&] { simulator_kernels::static_shared(out.get(), 12289, 0, true); });
  CHECK(contains(message, "uses 49156 bytes of static __shared__ memory, above the 49152 a kernel may declare"));
  CHECK(contains(message, "static_shared_kernel"));
  CHECK_NOTHROW(simulator_kernels::static_shared(out.get(), 8192, 16 * 1024, false));  // 32 + 16 KiB
  message = error_of([&] { simulator_kernels::static_shared(out.get(), 8192, 16 * 1024 + 4, false); });
  CHECK(contains(message, "uses 32768 bytes of static __shared__ memory and 16388 dynamic, above the 49152 bytes a "
                          "block may have on sm_90 without opting in"));
  CHECK_NOTHROW(simulator_kernels::static_shared(out.get(), 8192, 16 * 1024 + 4, true));
}
