// Several simulated devices in one process (docs/fsdp_on_gpus.md, piece 1):
// each with its own memory, capacity, allocator and statistics; a current
// device per host thread; work on one device refused another's memory; a
// copy between devices through the host. Simulator only: a GPU machine has
// the devices it has.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/fiber_stacks.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/stream.h"

using namespace tessera;

namespace {

Device gpu(int index) { return Device(DeviceType::cuda, index); }

Tensor counting(int64_t count, Device device) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f - 3.0f;
  return ops::to(ops::from_vector(values, {count}), device);
}

}  // namespace

TEST_SUITE("cuda devices") {

TEST_CASE("the simulator has cuda:0 to cuda:15; any other is refused, naming them") {
  CHECK(cuda::device_count() == 16);
  for (int index : {16, 100, -1}) {
    CAPTURE(index);
    CHECK_THROWS_WITH_AS(Stream::create(gpu(index)),
                         doctest::Contains("the simulator has 16 devices, cuda:0 to cuda:15"), Error);
    CHECK_THROWS_WITH_AS(ops::empty({4}, {.device = gpu(index)}), doctest::Contains("cuda:0 to cuda:15"), Error);
  }
}

TEST_CASE("fiber stacks: guard pages within the process's budget, canaries beyond it, an overrun named") {
  using cuda::sim::FiberStacks;
  const int64_t before = FiberStacks::guarded_in_process();
  {
    FiberStacks small;
    small.reserve(64);
    CHECK(small.guarded());
    CHECK(FiberStacks::guarded_in_process() == before + 64);
    // A pool that would pass the budget (on 16 devices, the memory areas
    // Linux allows a process) takes canaries instead of guard pages.
    FiberStacks large;
    large.reserve(static_cast<int>(FiberStacks::kGuardedStacks));
    CHECK_FALSE(large.guarded());
    CHECK(FiberStacks::guarded_in_process() == before + 64);
    CHECK_NOTHROW(large.check_canaries(1024, "intact"));
    // A thread that ran past its stack's end wrote into the canary below it.
    const boost::context::stack_context third = large.stack(2);
    static_cast<unsigned char*>(third.sp)[-static_cast<std::ptrdiff_t>(third.size) - 8] = 0;
    CHECK_THROWS_WITH_AS(large.check_canaries(1024, "deep_recursion"),
                         "cuda sim: a thread of kernel `deep_recursion` overran its 64 KiB stack (fiber stack 2; the "
                         "simulator runs each thread on a fiber: deep recursion or large local arrays)",
                         Error);
    CHECK_NOTHROW(large.check_canaries(1024, "rewritten"));  // the pool stays usable
    CHECK_NOTHROW(large.check_canaries(2, "only the first two"));
  }
  CHECK(FiberStacks::guarded_in_process() == before);
}

TEST_CASE("each device has its own memory, allocator and statistics") {
  release_cached_memory(gpu(1));
  const MemoryStats before0 = memory_stats(gpu(0)), before1 = memory_stats(gpu(1));
  const int64_t mallocs0 = cuda::CachingAllocator::of(0).stats().device_mallocs;
  const int64_t mallocs1 = cuda::CachingAllocator::of(1).stats().device_mallocs;
  {
    const Tensor on1 = ops::empty({1 << 20}, {.device = gpu(1)});
    CHECK(cuda::sim::device_of_address(on1.cuda_data()) == 1);
    CHECK(memory_stats(gpu(1)).live_bytes == before1.live_bytes + (4 << 20));
    CHECK(memory_stats(gpu(0)).live_bytes == before0.live_bytes);
    // A 4 MiB block is a segment of its own, taken from cuda:1's heap only.
    CHECK(cuda::CachingAllocator::of(1).stats().device_mallocs == mallocs1 + 1);
    CHECK(cuda::CachingAllocator::of(0).stats().device_mallocs == mallocs0);
    CHECK(cuda::CachingAllocator::of(1).device() == 1);
    const Tensor on0 = ops::empty({16}, {.device = gpu(0)});
    CHECK(cuda::sim::device_of_address(on0.cuda_data()) == 0);
  }
  CHECK(memory_stats(gpu(1)).live_bytes == before1.live_bytes);
}

TEST_CASE("a device's capacity is its own: one out of memory, the next one allocates") {
  release_cached_memory(gpu(2));
  const int64_t capacity = cuda::sim::device_capacity(2);
  cuda::sim::set_device_capacity(2, cuda::sim::device_bytes_in_use(2) + (8 << 20));
  CHECK_THROWS_WITH_AS(ops::empty({16 << 20}, {.device = gpu(2)}),
                       doctest::Contains("cuda allocator: out of memory allocating 64.0 MiB (67108864 bytes) on cuda:2"),
                       Error);
  const Tensor on3 = ops::empty({16 << 20}, {.device = gpu(3)});
  CHECK(on3.numel() == 16 << 20);
  release_cached_memory(gpu(2));
  cuda::sim::set_device_capacity(2, capacity);
  CHECK_THROWS_WITH_AS(cuda::sim::set_device_capacity(2, int64_t{64} << 30),
                       doctest::Contains("cuda:2's capacity of 68719476736 bytes is below the"), Error);
}

TEST_CASE("the current device is per host thread, as cudaSetDevice") {
  CHECK(cuda::current_device() == 0);
  int seen_elsewhere = -1, set_elsewhere = -1;
  std::thread other([&] {
    seen_elsewhere = cuda::current_device();
    cuda::set_device(5);
    set_elsewhere = cuda::current_device();
  });
  other.join();
  CHECK(seen_elsewhere == 0);
  CHECK(set_elsewhere == 5);
  CHECK(cuda::current_device() == 0);
  CHECK_THROWS_WITH_AS(cuda::set_device(16), doctest::Contains("there is no cuda:16"), Error);
  CHECK(cuda::current_device() == 0);
}

TEST_CASE("work on one device refuses another device's memory, naming both") {
  const Tensor on0 = ops::empty({64}, {.device = gpu(0)});
  const std::vector<float> host(64, 1.0f);
  const std::shared_ptr<Stream> stream1 = Stream::create(gpu(1));
  CHECK_THROWS_WITH_AS(cuda::memcpy_async(on0.cuda_data(), host.data(), 256, cuda::CopyKind::host_to_device, *stream1),
                       doctest::Contains("memcpy host to device on cuda:1: buffer `destination` (256 bytes at"), Error);
  CHECK_THROWS_WITH_AS(cuda::memcpy_async(on0.cuda_data(), host.data(), 256, cuda::CopyKind::host_to_device, *stream1),
                       doctest::Contains("is cuda:0's memory"), Error);
  // The ops refuse operands on two devices before any kernel runs.
  const Tensor on1 = ops::empty({64}, {.device = gpu(1)});
  CHECK_THROWS_WITH_AS(ops::add(on0, on1), doctest::Contains("cuda:0 and cuda:1"), Error);
}

TEST_CASE("a copy between devices goes through the host and keeps every bit") {
  const Tensor on2 = counting(1000, gpu(2));
  const Tensor on5 = ops::to(on2, gpu(5));
  CHECK(on5.device() == gpu(5));
  CHECK(cuda::sim::device_of_address(on5.cuda_data()) == 5);
  CHECK(ops::to(on5, kCPU).to_vector<float>() == ops::to(on2, kCPU).to_vector<float>());
  // Into a view of another dtype on a third device: broadcast and convert as copy_ does.
  Tensor into = ops::zeros({2, 1000}, {.dtype = DType::f64, .device = gpu(6)});
  ops::copy_(into, on2);
  const std::vector<double> back = ops::to(into, kCPU).to_vector<double>();
  CHECK(back[1999] == 999 * 0.5 - 3.0);
  CHECK(back[0] == -3.0);
}

}  // TEST_SUITE
