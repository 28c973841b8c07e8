// The cuda device's caching allocator: segments and blocks, stream-aware
// reuse, statistics, out of memory after emptying the cache, and the
// stream-ordering checker catching a block reused before another stream is
// done with it.
#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/sim_stream.h"
#include "tensor/error.h"
#include "tensor/stream.h"
#include "tests/cuda/simulator_kernels.h"

using namespace tessera;
using cuda::CachingAllocator;

namespace {

const Device kCuda(DeviceType::cuda);

// Each case starts from an empty cache and its own allocator.
struct FreshAllocator {
  CachingAllocator allocator{0};
  ~FreshAllocator() { allocator.release_cached_memory(); }
};

// Blocks `stream` until released, so events recorded after it stay pending.
// The flag is shared with the waiting task: it may still read it after the
// gate is gone.
struct StreamGate {
  explicit StreamGate(Stream& stream) {
    stream.enqueue([open = open] {
      while (!open->load()) std::this_thread::yield();
    });
  }
  ~StreamGate() { *open = true; }
  std::shared_ptr<std::atomic<bool>> open = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

TEST_CASE("blocks round to 512 bytes; small requests share 2 MiB segments, large ones get their own") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto stream = Stream::create(kCuda);
  void* a = allocator.allocate(100, stream);
  void* b = allocator.allocate(1000, stream);
  cuda::AllocatorStats stats = allocator.stats();
  CHECK(stats.allocated_bytes == 512 + 1024);
  CHECK(stats.requested_bytes == 1100);
  CHECK(stats.reserved_bytes == CachingAllocator::kSmallSegment);
  CHECK(stats.device_mallocs == 1);
  CHECK(static_cast<char*>(b) - static_cast<char*>(a) == 512);  // split from one segment
  CHECK(reinterpret_cast<uintptr_t>(a) % 256 == 0);

  void* large = allocator.allocate(3 << 20, stream);
  stats = allocator.stats();
  CHECK(stats.device_mallocs == 2);
  CHECK(stats.reserved_bytes == CachingAllocator::kSmallSegment + (4 << 20));
  // The 1 MiB left in its segment is not worth a block of its own (large splits keep more than 1 MiB).
  CHECK(stats.peak_allocated_bytes == 512 + 1024 + (4 << 20));

  allocator.free(a);
  allocator.free(b);
  allocator.free(large);
  stats = allocator.stats();
  CHECK(stats.allocated_bytes == 0);
  CHECK(stats.live_blocks == 0);
  CHECK(stats.largest_free_block == 4 << 20);
  CHECK(stats.reserved_bytes == CachingAllocator::kSmallSegment + (4 << 20));  // cached, not returned
  allocator.reset_peak();
  CHECK(allocator.stats().peak_allocated_bytes == 0);

  stream->synchronize();
  allocator.release_cached_memory();
  stats = allocator.stats();
  CHECK(stats.reserved_bytes == 0);
  CHECK(stats.device_frees == 2);
  CHECK_THROWS_WITH_AS(allocator.free(a), doctest::Contains("did not hand out"), Error);
}

TEST_CASE("a freed block is reused at once on its stream, and on another only after its event") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto first = Stream::create(kCuda), second = Stream::create(kCuda);
  void* block = nullptr;
  {
    StreamGate gate(*first);  // the free's event on `first` stays pending
    block = allocator.allocate(4096, first);
    allocator.free(block);
    void* same_stream = allocator.allocate(4096, first);
    CHECK(same_stream == block);  // stream order covers the last use
    allocator.free(same_stream);
    void* other_stream = allocator.allocate(4096, second);
    CHECK(other_stream != block);  // first has not reached the free yet
    allocator.free(other_stream);
  }
  first->synchronize();
  second->synchronize();
  void* later = allocator.allocate(4096, second);
  CHECK(later == block);  // the event completed: reusable anywhere
  allocator.free(later);
}

TEST_CASE("the rest of a freed block, split on its own stream, keeps the block's last uses for other streams") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto first = Stream::create(kCuda), second = Stream::create(kCuda);
  char* block = nullptr;
  {
    StreamGate gate(*first);  // the free's event on `first` stays pending
    block = static_cast<char*>(allocator.allocate(8192, first));
    allocator.free(block);  // merges with the rest of its segment: one free block, one pending event
    void* front = allocator.allocate(4096, first);
    CHECK(front == block);  // stream order covers the last use
    // The back half's last use (on `first`) has not run: `second` may not have it.
    void* other_stream = allocator.allocate(4096, second);
    CHECK(other_stream != block + 4096);
    allocator.free(other_stream);
    allocator.free(front);
  }
  first->synchronize();
  second->synchronize();
  void* later = allocator.allocate(8192, second);
  CHECK(later == block);  // every event has completed: reusable anywhere
  allocator.free(later);
}

TEST_CASE("a free records its events with no host function; the next allocations poll them") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto first = Stream::create(kCuda), second = Stream::create(kCuda);
  void* block = nullptr;
  {
    StreamGate gate(*first);  // a user's host function: the free's event on `first` stays pending
    const int64_t host_functions = cuda::sim::host_functions_enqueued();
    block = allocator.allocate(4096, first);
    allocator.record_stream(block, second);
    allocator.free(block);  // an event on each stream that used it
    for (int i = 0; i < 100; ++i) allocator.free(allocator.allocate(4096, first));
    void* elsewhere = allocator.allocate(4096, second);
    CHECK(elsewhere != block);  // polled: first has not reached the free yet
    allocator.free(elsewhere);
    CHECK(cuda::sim::host_functions_enqueued() == host_functions);  // on a GPU: cudaEventRecord, no cudaLaunchHostFunc
  }
  first->synchronize();
  second->synchronize();
  void* later = allocator.allocate(4096, second);
  CHECK(later == block);  // polled again: every event has completed
  allocator.free(later);
}

TEST_CASE("record_stream: a block used on another stream waits for it before reuse, even on its own stream") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto owner = Stream::create(kCuda), user = Stream::create(kCuda);
  void* block = allocator.allocate(8192, owner);
  {
    StreamGate gate(*user);
    allocator.record_stream(block, user);
    allocator.free(block);
    void* next = allocator.allocate(8192, owner);
    CHECK(next != block);
    allocator.free(next);
  }
  user->synchronize();
  owner->synchronize();
  void* reused = allocator.allocate(8192, owner);
  CHECK(reused == block);
  allocator.free(reused);
  CHECK_THROWS_WITH_AS(allocator.record_stream(block, user), doctest::Contains("not a live block"), Error);
}

TEST_CASE("out of memory is an error with the statistics, after the cache was emptied once") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto stream = Stream::create(kCuda);
  const int64_t capacity = cuda::sim::device_capacity(0);
  cuda::sim::set_device_capacity(0, cuda::sim::device_bytes_in_use(0) + (20 << 20));
  void* cached = allocator.allocate(8 << 20, stream);
  allocator.free(cached);  // 8 MiB cached
  void* held = allocator.allocate(6 << 20, stream);  // reuses the cached segment (split)
  CHECK(allocator.stats().device_mallocs == 1);
  void* big = allocator.allocate(10 << 20, stream);  // a second segment: 18 of the 20 MiB
  CHECK(big != nullptr);
  std::string message;
  try {
    allocator.allocate(12 << 20, stream);
  } catch (const Error& error) {
    message = error.what();
  }
  CAPTURE(message);
  CHECK(message.find("out of memory allocating 12.0 MiB") != std::string::npos);
  CHECK(message.find("after emptying the cache") != std::string::npos);
  CHECK(message.find("16.0 MiB allocated in 2 blocks") != std::string::npos);
  CHECK(allocator.stats().cache_flushes == 1);
  allocator.free(held);
  allocator.free(big);
  stream->synchronize();
  CHECK_NOTHROW(allocator.free(allocator.allocate(12 << 20, stream)));  // emptying the cache made room
  stream->synchronize();
  allocator.release_cached_memory();
  cuda::sim::set_device_capacity(0, capacity);
  auto cpu_stream = Stream::default_stream(kCPU);
  CHECK_THROWS_WITH_AS(allocator.allocate(16, cpu_stream), doctest::Contains("needs a cuda stream"), Error);
}

TEST_CASE("the ordering checker catches a block reused while another stream still reads it") {
  FreshAllocator fresh;
  CachingAllocator& allocator = fresh.allocator;
  auto owner = Stream::create(kCuda), reader = Stream::create(kCuda);
  const int n = 64;
  const auto floats = [&](const std::shared_ptr<Stream>& stream) {
    return static_cast<float*>(allocator.allocate(n * 4, stream));
  };
  float* source = floats(owner);
  cuda::sim::mark_device_written(source, n * 4);  // its values do not matter here, only the order of its uses
  float* sink = floats(reader);
  float* x = floats(owner);
  simulator_kernels::reverse_in_shared(source, x, n, owner.get());  // owner writes x
  Event written;
  written.record(*owner);
  reader->wait_event(written);
  simulator_kernels::reverse_in_shared(x, sink, n, reader.get());  // reader reads x

  SUBCASE("without record_stream the block comes back at once on its own stream, too early") {
    allocator.free(x);
    float* y = floats(owner);
    CHECK(y == x);
    CHECK_THROWS_WITH_AS(simulator_kernels::reverse_in_shared(source, y, n, owner.get()),
                         doctest::Contains("writes `out`"), Error);
    allocator.free(y);
  }
  SUBCASE("with record_stream it waits for the reader") {
    allocator.record_stream(x, reader);
    allocator.free(x);
    reader->synchronize();
    float* y = floats(owner);  // the reader's event has completed, and the host saw it
    CHECK(y == x);
    CHECK_NOTHROW(simulator_kernels::reverse_in_shared(source, y, n, owner.get()));
    allocator.free(y);
  }
  owner->synchronize();
  reader->synchronize();
  allocator.free(source);
  allocator.free(sink);
}
