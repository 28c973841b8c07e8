// Page-locked host buffers for transfers, cached. cudaHostAlloc is slow and
// cudaFreeHost synchronises the whole device, so a transfer takes a buffer
// from the pool and gives it back once its copy has run on the stream; the
// next transfer of the same size class reuses it. Sizes round up to a power
// of two (at least kMinPinnedBytes), as PyTorch's caching host allocator
// does: at most 2x the bytes asked for, and few classes to search.
//
// "Once its copy has run" is an Event recorded after the copy, which the
// pool polls (Event::query: cudaEventQuery on a GPU, no wait) whenever it is
// used, as PyTorch's host allocator processes its events: no host callback
// per transfer, which would stall the stream and may make no CUDA call.
#pragma once

#include <cstdint>
#include <memory>

#include "tensor/stream.h"

namespace tessera::cuda {

constexpr int64_t kMinPinnedBytes = 4096;

struct PinnedBlock {
  void* data = nullptr;
  int64_t capacity = 0;  // bytes, a power of two
};

// A block of at least `bytes` page-locked bytes: a cached one, or a new one.
PinnedBlock acquire_pinned(int64_t bytes);
// Gives `block` back for reuse (call once the copies that use it have run).
void release_pinned(PinnedBlock block);
// Gives `block` back once `copied`, recorded after the copies that use it,
// has completed; until then it counts as in use.
void release_pinned_after(PinnedBlock block, Event copied);
// Keeps `owner` (host memory a copy on a stream reads or writes) alive until
// `copied` has completed, seen at a later use of the pool (each transfer's).
void hold_until(Event copied, std::shared_ptr<const void> owner);

struct PinnedPoolStats {
  int64_t allocations = 0;    // cudaHostAlloc calls
  int64_t reuses = 0;         // acquires served from the cache
  int64_t cached_bytes = 0;   // bytes held in free blocks now
  int64_t in_use_bytes = 0;   // bytes acquired and not yet released (or their copies not seen complete)
};
// The statistics, once the completed copies' blocks are back in the pool.
PinnedPoolStats pinned_pool_stats();
// Frees every cached block (cudaFreeHost), those whose copies have completed
// too; blocks in use stay.
void empty_pinned_cache();

}  // namespace tessera::cuda
