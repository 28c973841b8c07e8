// The simulator against compute-sanitizer's standard and CUDA as people write
// it: each check has a kernel with the one bug it must name (the kernel, the
// thread, the buffer and the source line) and a correct kernel in the same
// idiom that runs without a report.
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "tensor/cuda/launch_config.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/memory_access.h"
#include "tests/cuda/device_buffer.h"
#include "tests/cuda/expected_error.h"
#include "tests/cuda/fidelity_kernels.h"

using tessera::testing::contains;
using tessera::testing::error_of;
namespace sim = tessera::cuda::sim;

namespace {

constexpr bool kSimChecks = TESSERA_SIM_CHECKS != 0;

std::vector<float> ramp(int count) {
  std::vector<float> values(count);
  for (int i = 0; i < count; ++i) values[i] = static_cast<float>(i % 13);
  return values;
}

struct StrictRacecheck {
  StrictRacecheck() { sim::set_strict_racecheck(true); }
  ~StrictRacecheck() { sim::set_strict_racecheck(false); }
};

}  // namespace

TEST_CASE("initcheck: a read of a fresh allocation names the kernel, thread, buffer, offset and line" *
          doctest::skip(!kSimChecks)) {
  DeviceBuffer<float> in(100), out(100);  // `in` is allocated, never written: it reads as zero
  const std::string message = error_of([&] { fidelity_kernels::add_one(in.get(), out.get(), 100); });
  CHECK(contains(message, "cuda sim initcheck: kernel `add_one_kernel` block ("));
  CHECK(contains(message, "thread ("));
  CHECK(contains(message, "at tests/cuda/fidelity_kernels.cu:22"));
  CHECK(contains(message, "of buffer `in`"));
  CHECK(contains(message, "never written since it was allocated"));
  CHECK(contains(message, "[and 99 more times at this site]"));  // every thread's read, one report

  // Memory a fill kernel wrote counts as written, as does memory copied in.
  fidelity_kernels::fill_zero(in.get(), 100);
  CHECK_NOTHROW(fidelity_kernels::add_one(in.get(), out.get(), 100));
  CHECK(out.read() == std::vector<float>(100, 1.0f));
  DeviceBuffer<float> copied(ramp(100));
  CHECK_NOTHROW(fidelity_kernels::add_one(copied.get(), out.get(), 100));
  CHECK(out.read()[12] == 13.0f);
}

TEST_CASE("initcheck: a static __shared__ accumulator never zeroed, right with one block by chance" *
          doctest::skip(!kSimChecks)) {
  const std::vector<float> values = ramp(4 * 64);
  DeviceBuffer<float> in(values), out(4);
  const std::string message = error_of([&] { fidelity_kernels::block_totals(in.get(), out.get(), 4, false); });
  CHECK(contains(message, "cuda sim initcheck: kernel `block_totals_kernel`"));
  CHECK(contains(message, "atomically updates 4 bytes at byte"));
  CHECK(contains(message, "of static shared memory"));
  CHECK(contains(message, "fidelity_kernels.cu:34"));
  CHECK(contains(message, "was not written by any thread of this block"));

  // Zeroed by thread 0 before the barrier: every block's total is right,
  // though the storage is one per OS thread and poisoned between blocks.
  fidelity_kernels::block_totals(in.get(), out.get(), 4, true);
  const std::vector<float> totals = out.read();
  for (int block = 0; block < 4; ++block) {
    CHECK(totals[block] == std::accumulate(values.begin() + 64 * block, values.begin() + 64 * (block + 1), 0.0f));
  }
}

TEST_CASE("initcheck: dynamic shared memory no thread wrote" * doctest::skip(!kSimChecks)) {
  DeviceBuffer<float> in(ramp(32)), out(32);
  const std::string message = error_of([&] { fidelity_kernels::read_next_staged(in.get(), out.get(), 32, false); });
  CHECK(contains(message, "cuda sim initcheck: kernel `read_next_staged_kernel` block (0,0,0) thread (31,0,0)"));
  CHECK(contains(message, "reads 4 bytes at byte 128 of dynamic shared memory"));
  CHECK(contains(message, "fidelity_kernels.cu:45"));
  CHECK_NOTHROW(fidelity_kernels::read_next_staged(in.get(), out.get(), 32, true));
  CHECK(out.read()[31] == 0.0f);
  CHECK(out.read()[3] == 4.0f);
}

TEST_CASE("memcheck holds a strided view to its elements, not its span" * doctest::skip(!kSimChecks)) {
  const int rows = 4, width = 8;
  DeviceBuffer<float> packed(std::vector<float>(rows * 3 * width, 0.0f));
  // The stride bug writes row 1 of q at packed[8..15]: k's first row, inside q's span.
  const std::string message = error_of([&] { fidelity_kernels::write_q_view(packed.get(), rows, width, width); });
  // Blocks 1 and 2 write outside the view (block 3 lands on q's row 1); whichever runs first faults.
  CHECK(contains(message, "cuda sim memcheck: kernel `write_q_view_kernel` block ("));
  CHECK(contains(message, "thread (0,0,0) at tests/cuda/fidelity_kernels.cu:49 writes 4 bytes at byte "));
  CHECK(contains(message, " of buffer `q f32[rows, width] of the packed qkv`"));
  CHECK(contains(message, "inside the span of the strided view but not on one of its elements"));

  fidelity_kernels::write_q_view(packed.get(), rows, width, 3 * width);
  const std::vector<float> values = packed.read();
  for (int i = 0; i < rows * 3 * width; ++i) CHECK(values[i] == (i % (3 * width) < width ? 1.0f : 0.0f));
}

TEST_CASE("a strided view is described by its dims in decreasing stride; a dense or self-overlapping one by its span") {
  using tessera::cuda::StridedElements;
  // Columns 0-2 of a [4, 6] buffer, transposed ([3, 4], strides 1 and 6), with a size-1 dim between.
  const int64_t sizes[3] = {3, 1, 4}, strides[3] = {1, 100, 6};
  const StridedElements view = StridedElements::of(4, 3, sizes, strides);
  CHECK(view.element_bytes == 4);
  REQUIRE(view.dims == 2);
  CHECK(view.sizes[0] == 4);
  CHECK(view.strides[0] == 6);
  CHECK(view.sizes[1] == 3);
  CHECK(view.strides[1] == 1);
  CHECK(view.contains(6 + 2));
  CHECK_FALSE(view.contains(3));
  // Dense, overlapping itself (equal strides), or empty: the span describes it.
  const int64_t dense_sizes[2] = {4, 6}, dense_strides[2] = {6, 1};
  CHECK(StridedElements::of(4, 2, dense_sizes, dense_strides).element_bytes == 0);
  const int64_t overlapping_strides[2] = {2, 2};
  CHECK(StridedElements::of(4, 2, dense_sizes, overlapping_strides).element_bytes == 0);
  const int64_t empty_sizes[2] = {0, 6};
  CHECK(StridedElements::of(4, 2, empty_sizes, dense_strides).element_bytes == 0);
  const int64_t nine[9] = {2, 2, 2, 2, 2, 2, 2, 2, 2};
  CHECK_THROWS_WITH_AS(StridedElements::of(4, 9, nine, nine), "StridedElements::of: 9 dims; a view has 0 to 8",
                       tessera::Error);
}

TEST_CASE("memcheck: misaligned float4 and __nv_bfloat162 accesses fault, as on the hardware" *
          doctest::skip(!kSimChecks)) {
  DeviceBuffer<float> in(ramp(4 * 8 + 4)), out(8);
  std::string message = error_of([&] { fidelity_kernels::load_float4(in.get(), out.get(), 8, 1); });
  CHECK(contains(message, "cuda sim memcheck: kernel `load_float4_kernel` block (0,0,0) thread (0,0,0)"));
  CHECK(contains(message, "fidelity_kernels.cu:56"));
  CHECK(contains(message, "'const struct float4' at 0x"));
  CHECK(contains(message, "which is not a multiple of 16 (misaligned address"));
  CHECK_NOTHROW(fidelity_kernels::load_float4(in.get(), out.get(), 8, 4));
  CHECK(out.read()[0] == 4.0f + 5 + 6 + 7);

  std::vector<__nv_bfloat16> pairs(2 * 8 + 2);
  for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = __float2bfloat16(static_cast<float>(i));
  DeviceBuffer<__nv_bfloat16> bf16(pairs);
  message = error_of([&] { fidelity_kernels::load_bfloat162(bf16.get(), out.get(), 8, 1); });
  CHECK(contains(message, "cuda sim memcheck: kernel `load_bfloat162_kernel`"));
  CHECK(contains(message, "fidelity_kernels.cu:63"));
  CHECK(contains(message, "'const struct __nv_bfloat162' at 0x"));
  CHECK(contains(message, "which is not a multiple of 4 (misaligned address"));
  CHECK_NOTHROW(fidelity_kernels::load_bfloat162(bf16.get(), out.get(), 8, 2));
  CHECK(out.read()[1] == 4.0f + 5.0f);
}

TEST_CASE("a launch on no stream (CUDA's legacy default stream) is refused, never run unchecked") {
  DeviceBuffer<float> out(32);
  const std::string message = error_of([&] { fidelity_kernels::launch_on_null_stream(out.get()); });
  CHECK(contains(message, "launch of `fill_zero_kernel` on no stream, which is CUDA's legacy default stream"));
  CHECK(contains(message, "set LaunchConfig::stream"));
  CHECK(sim::first_unwritten_device_byte(out.get(), 4) == 0);  // nothing ran
}

TEST_CASE("__syncwarp(mask) orders only the lanes of its mask, transitively" * doctest::skip(!kSimChecks)) {
  DeviceBuffer<int> out(32);
  const std::string message = error_of([&] { fidelity_kernels::swap_halves(out.get(), true); });
  CHECK(contains(message, "cuda sim racecheck: kernel `swap_halves_kernel` block (0,0,0): read-after-write hazard"));
  CHECK(contains(message, "fidelity_kernels.cu:78"));  // the read
  CHECK(contains(message, "fidelity_kernels.cu:70"));  // the other lane's store

  fidelity_kernels::swap_halves(out.get(), false);
  const std::vector<int> swapped = out.read();
  for (int lane = 0; lane < 32; ++lane) CHECK(swapped[lane] == (lane + 16) % 32);
  fidelity_kernels::pass_along_pairs(out.get());
  CHECK(out.read()[0] == 100);
}

// Volatile loads are polls only through the instrumentation hooks, which the
// AddressSanitizer build does not have: there a volatile spin never yields.
TEST_CASE("spin-waits on volatile or atomic polls run; a spin no thread can end is a named deadlock" *
          doctest::skip(!kSimChecks)) {
  DeviceBuffer<int> counter(std::vector<int>{0}), out(96);
  fidelity_kernels::ticket_chain(counter.get(), out.get(), 96);
  const std::vector<int> tickets = out.read();
  for (int t = 0; t < 96; ++t) CHECK(tickets[t] == t);
  CHECK(counter.read()[0] == 96);

  DeviceBuffer<int> flag(std::vector<int>{0});
  for (const bool use_atomic : {false, true}) {
    CAPTURE(use_atomic);
    const std::string message = error_of([&] { fidelity_kernels::spin_forever(flag.get(), use_atomic); });
    CHECK(contains(message, "kernel `spin_forever_kernel` block (0,0,0): a spin-wait that can never end: 1 thread "
                            "((0,0,0)) poll memory at tests/cuda/fidelity_kernels.cu:"));
    CHECK(contains(message, use_atomic ? "fidelity_kernels.cu:104" : "fidelity_kernels.cu:108"));
    CHECK(contains(message, "31 threads ((1,0,0) to (31,0,0)) exited"));
  }
}

TEST_CASE("lanes that exited leave a full-mask shuffle defined unless it reads them") {
  DeviceBuffer<int> out(16);
  fidelity_kernels::shuffle_after_exit(out.get(), false);
  CHECK(out.read() == std::vector<int>(16, 0));
  const std::string message = error_of([&] { fidelity_kernels::shuffle_after_exit(out.get(), true); });
  CHECK(contains(message, "kernel `shuffle_after_exit_kernel` block (0,0,0): __shfl_down_sync(mask 0xffffffff) at "));
  CHECK(contains(message, "fidelity_kernels.cu:116"));
  CHECK(contains(message, "lane 8 reads lane 16, which has exited: the value it receives is undefined"));
}

TEST_CASE("racecheck: same-value stores are benign unless strict; every hazard of a launch is reported" *
          doctest::skip(!kSimChecks)) {
  DeviceBuffer<int> out(2);
  CHECK_NOTHROW(fidelity_kernels::same_value_flag(out.get(), false));
  CHECK(out.read()[0] == 1);

  // The benign store comes first in every thread; the real race after it is still reported.
  std::string message = error_of([&] { fidelity_kernels::same_value_flag(out.get(), true); });
  CHECK(contains(message, "write-after-write hazard on static shared memory"));
  CHECK(contains(message, "fidelity_kernels.cu:123"));
  CHECK(message.find("fidelity_kernels.cu:122") == std::string::npos);

  StrictRacecheck strict;
  message = error_of([&] { fidelity_kernels::same_value_flag(out.get(), true); });
  CHECK(contains(message, "fidelity_kernels.cu:122"));
  CHECK(contains(message, "stored the value already there (a same-value write"));
  CHECK(contains(message, "fidelity_kernels.cu:123"));
}
