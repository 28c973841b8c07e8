#include "tensor/cuda/caching_allocator.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace tessera::cuda {

namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

CachingAllocator& CachingAllocator::of(int device) {
  check_device_index(device);
  // Never destroyed, the table included: tensors may outlive statics, and a
  // table destroyed at exit would leave a tensor freed later reading freed
  // memory (and the allocators unreachable: leaks to LeakSanitizer). Made
  // under a lock, read without one once made (an allocator's address never
  // changes).
  static auto* const mutex = new std::mutex;
  static auto* const allocators =
      new std::vector<std::atomic<CachingAllocator*>>(static_cast<size_t>(device_count()));
  std::atomic<CachingAllocator*>& slot = (*allocators)[static_cast<size_t>(device)];
  if (CachingAllocator* made = slot.load(std::memory_order_acquire)) return *made;
  std::lock_guard lock(*mutex);
  if (slot.load(std::memory_order_relaxed) == nullptr) slot.store(new CachingAllocator(device), std::memory_order_release);
  return *slot.load(std::memory_order_relaxed);
}

CachingAllocator::~CachingAllocator() { release_cached_memory(); }

// Polls the events of the block's other streams (cudaEventQuery on a GPU:
// no wait, no host callback) and forgets those that have completed, as
// PyTorch's allocator processes its outstanding events; the block's own
// stream is covered by stream order.
bool CachingAllocator::reusable_on(Block& block, const Stream& stream) {
  std::erase_if(block.last_uses,
                [&](const Block::LastUse& use) { return use.stream.get() != &stream && use.done.query(); });
  return std::all_of(block.last_uses.begin(), block.last_uses.end(),
                     [&](const Block::LastUse& use) { return use.stream.get() == &stream; });
}

CachingAllocator::Block* CachingAllocator::find_free(int64_t bytes, bool small,
                                                     const std::shared_ptr<Stream>& stream) {
  FreeBlocks& pool = small ? free_small_ : free_large_;
  Block probe;
  probe.bytes = bytes;
  for (auto it = pool.lower_bound(&probe); it != pool.end(); ++it) {
    Block* block = *it;
    if (!reusable_on(*block, *stream)) continue;
    pool.erase(it);
    return block;  // as it was freed: split's remainder keeps its stream and last uses
  }
  return nullptr;
}

CachingAllocator::Block* CachingAllocator::take_segment(int64_t bytes, bool small) {
  const int64_t size = small ? kSmallSegment : round_up(bytes, kLargeRounding);
  void* data = device_malloc(device_, size);
  if (data == nullptr) return nullptr;
  auto* block = new Block;
  block->data = static_cast<char*>(data);
  block->bytes = size;
  block->small = small;
  segments_.push_back(block);
  stats_.reserved_bytes += size;
  stats_.device_mallocs += 1;
  return block;
}

// Cuts `block` to `bytes` when the rest is worth keeping (any 512 bytes in
// the small pool, more than a small request in the large one); the rest goes
// back to the free blocks.
CachingAllocator::Block* CachingAllocator::split(Block* block, int64_t bytes) {
  const int64_t rest = block->bytes - bytes;
  if (block->small ? rest < kRounding : rest <= kSmallRequest) return block;
  auto* remainder = new Block(*block);
  remainder->data = block->data + bytes;
  remainder->bytes = rest;
  remainder->previous = block;
  remainder->next = block->next;
  if (block->next != nullptr) block->next->previous = remainder;
  block->next = remainder;
  block->bytes = bytes;
  insert_free(remainder);
  return block;
}

void* CachingAllocator::allocate(int64_t bytes, const std::shared_ptr<Stream>& stream) {
  TESSERA_CHECK(bytes >= 0, "cuda allocator: negative size {} bytes", bytes);
  TESSERA_CHECK(stream != nullptr && stream->device().is_cuda(), "cuda allocator: a block needs a cuda stream");
  TESSERA_CHECK(stream->device().index == device_, "cuda allocator: a block of cuda:{} for a stream of {}", device_,
                stream->device().str());
  const int64_t rounded = std::max(kRounding, round_up(bytes, kRounding));
  const bool small = rounded <= kSmallRequest;
  std::lock_guard lock(mutex_);
  Block* block = find_free(rounded, small, stream);
  if (block == nullptr) {
    block = take_segment(rounded, small);
    if (block == nullptr) {
      release_free_segments();
      stats_.cache_flushes += 1;
      block = take_segment(rounded, small);
    }
    if (block == nullptr) fail_out_of_memory(bytes);
    block->stream = stream;
  }
  // The rest of a cached block stays its old stream's, with the events of
  // its last uses: had it taken `stream` and no events, another stream could
  // take it at once while the old one still read it (a reduce-scatter
  // stream's copy to the host, under a compute kernel's writes).
  block = split(block, rounded);
  block->stream = stream;
  block->other_streams.clear();
  block->last_uses.clear();
  block->in_use = true;
  block->requested = bytes;
  live_[block->data] = block;
  stats_.allocated_bytes += block->bytes;
  stats_.requested_bytes += bytes;
  stats_.live_blocks += 1;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return block->data;
}

void CachingAllocator::free(void* pointer) {
  std::lock_guard lock(mutex_);
  const auto it = live_.find(static_cast<char*>(pointer));
  TESSERA_CHECK(it != live_.end(), "cuda allocator: free of {}, which it did not hand out (or freed twice)", pointer);
  Block* block = it->second;
  live_.erase(it);
  block->in_use = false;
  stats_.allocated_bytes -= block->bytes;
  stats_.requested_bytes -= block->requested;
  stats_.live_blocks -= 1;
  block->last_uses.push_back({block->stream, Event()});
  for (const std::shared_ptr<Stream>& other : block->other_streams) block->last_uses.push_back({other, Event()});
  for (Block::LastUse& use : block->last_uses) use.done.record(*use.stream);
  block->other_streams.clear();
  merge_free_neighbours(block);
}

// A free block absorbs free neighbours of the same stream (their events
// join its own), so segments do not fragment into pieces nothing fits.
void CachingAllocator::merge_free_neighbours(Block* block) {
  FreeBlocks& pool = block->small ? free_small_ : free_large_;
  const auto mergeable = [&](const Block* other) {
    return other != nullptr && !other->in_use && other->stream == block->stream;
  };
  if (mergeable(block->previous)) {
    Block* previous = block->previous;
    pool.erase(previous);
    previous->bytes += block->bytes;
    previous->next = block->next;
    if (block->next != nullptr) block->next->previous = previous;
    previous->last_uses.insert(previous->last_uses.end(), block->last_uses.begin(), block->last_uses.end());
    delete block;
    block = previous;
  }
  if (mergeable(block->next)) {
    Block* next = block->next;
    pool.erase(next);
    block->bytes += next->bytes;
    block->next = next->next;
    if (next->next != nullptr) next->next->previous = block;
    block->last_uses.insert(block->last_uses.end(), next->last_uses.begin(), next->last_uses.end());
    delete next;
  }
  insert_free(block);
}

void CachingAllocator::insert_free(Block* block) { (block->small ? free_small_ : free_large_).insert(block); }

void CachingAllocator::record_stream(void* pointer, const std::shared_ptr<Stream>& stream) {
  std::lock_guard lock(mutex_);
  const auto it = live_.find(static_cast<char*>(pointer));
  TESSERA_CHECK(it != live_.end(), "cuda allocator: record_stream on {}, which is not a live block", pointer);
  Block* block = it->second;
  if (stream == block->stream) return;
  if (std::find(block->other_streams.begin(), block->other_streams.end(), stream) == block->other_streams.end()) {
    block->other_streams.push_back(stream);
  }
}

// Segments whose blocks are all free go back to the runtime, once their
// last uses have run.
void CachingAllocator::release_free_segments() {
  std::vector<Block*> kept;
  for (Block* first : segments_) {
    bool all_free = true;
    for (Block* block = first; block != nullptr; block = block->next) all_free = all_free && !block->in_use;
    if (!all_free) {
      kept.push_back(first);
      continue;
    }
    char* base = first->data;
    int64_t size = 0;
    for (Block* block = first; block != nullptr;) {
      for (const Block::LastUse& use : block->last_uses) use.done.synchronize();
      (block->small ? free_small_ : free_large_).erase(block);
      size += block->bytes;
      Block* next = block->next;
      delete block;
      block = next;
    }
    device_free(device_, base);
    stats_.reserved_bytes -= size;
    stats_.device_frees += 1;
  }
  segments_ = std::move(kept);
}

void CachingAllocator::release_cached_memory() {
  std::lock_guard lock(mutex_);
  release_free_segments();
}

AllocatorStats CachingAllocator::stats() {
  std::lock_guard lock(mutex_);
  AllocatorStats stats = stats_;
  for (const FreeBlocks* pool : {&free_small_, &free_large_}) {
    if (!pool->empty()) stats.largest_free_block = std::max(stats.largest_free_block, (*pool->rbegin())->bytes);
  }
  return stats;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void CachingAllocator::fail_out_of_memory(int64_t bytes) {
  AllocatorStats stats = stats_;
  for (const FreeBlocks* pool : {&free_small_, &free_large_}) {
    if (!pool->empty()) stats.largest_free_block = std::max(stats.largest_free_block, (*pool->rbegin())->bytes);
  }
  fail("cuda allocator: out of memory allocating {} ({} bytes) on cuda:{} ({} runtime), after emptying the cache: {} "
       "allocated in {} blocks, {} reserved in segments, {} peak, {} device mallocs, largest free block {}",
       mib(bytes), bytes, device_, runtime_name(), mib(stats.allocated_bytes), stats.live_blocks, mib(stats.reserved_bytes),
       mib(stats.peak_allocated_bytes), stats.device_mallocs, mib(stats.largest_free_block));
}

}  // namespace tessera::cuda
