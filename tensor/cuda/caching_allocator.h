// The cuda device's caching allocator, modelled on what PyTorch users rely on
// and going a step further on stream reuse. Device mallocs are slow and
// synchronise, so memory is taken from the runtime in segments and handed
// out as blocks: sizes round to 512 bytes, requests up to 1 MiB share 2 MiB
// segments, larger ones get segments of their own (rounded to 2 MiB), and a
// free block is split to fit. A block belongs to the stream it was
// allocated on: freed, it is reusable at once on that stream (stream order
// covers its last use); on another stream only after an event recorded at
// the free, or on every stream it was used on (record_stream), has
// completed. Statistics are PyTorch's: allocated, reserved, peak, device
// mallocs, the largest free block. Out of memory is a tessera::Error with
// those statistics, raised only after the cache has been emptied once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tensor/stream.h"

namespace tessera::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  int64_t requested_bytes = 0;       // what callers asked for
  int64_t reserved_bytes = 0;        // in segments taken from the runtime
  int64_t peak_allocated_bytes = 0;  // since the last reset_peak
  int64_t device_mallocs = 0;        // segments taken, ever
  int64_t device_frees = 0;          // segments returned, ever
  int64_t largest_free_block = 0;    // bytes, among cached blocks
  int64_t live_blocks = 0;
  int64_t cache_flushes = 0;         // out-of-memory retries that emptied the cache
};

class CachingAllocator {
 public:
  // cuda:`device`'s allocator (one per device, made on first use; a device
  // that does not exist is an Error naming what does).
  static CachingAllocator& of(int device);
  explicit CachingAllocator(int device) : device_(device) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  int device() const { return device_; }
  // A block of at least `bytes` (256-byte aligned) for use on `stream`, a
  // stream of this allocator's device.
  void* allocate(int64_t bytes, const std::shared_ptr<Stream>& stream);
  // Returns a block; its memory is reused as described above.
  void free(void* pointer);
  // The block is also used on `stream`: its reuse waits for that stream too.
  void record_stream(void* pointer, const std::shared_ptr<Stream>& stream);
  // Returns every segment with no block in use to the runtime.
  void release_cached_memory();

  AllocatorStats stats();
  void reset_peak();
  static constexpr int64_t kRounding = 512;
  static constexpr int64_t kSmallRequest = int64_t{1} << 20;
  static constexpr int64_t kSmallSegment = int64_t{2} << 20;
  static constexpr int64_t kLargeRounding = int64_t{2} << 20;

 private:
  struct Block {
    char* data = nullptr;
    int64_t bytes = 0;
    int64_t requested = 0;
    bool small = false;  // from the small pool
    bool in_use = false;
    std::shared_ptr<Stream> stream;                      // allocated on
    std::vector<std::shared_ptr<Stream>> other_streams;  // record_stream
    // Recorded at the free on every stream that used the block (merged
    // neighbours bring theirs): pooled events without timing, recorded
    // with no host callback. Reuse on a stream waits for the events of the
    // other streams; its own are covered by stream order.
    struct LastUse {
      std::shared_ptr<Stream> stream;
      Event done;
    };
    std::vector<LastUse> last_uses;
    Block* previous = nullptr;  // neighbours within the segment, for splitting and merging
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->bytes != b->bytes ? a->bytes < b->bytes : a->data < b->data;
    }
  };
  using FreeBlocks = std::set<Block*, BySize>;

  Block* find_free(int64_t bytes, bool small, const std::shared_ptr<Stream>& stream);
  Block* take_segment(int64_t bytes, bool small);
  Block* split(Block* block, int64_t bytes);
  void insert_free(Block* block);
  void release_free_segments();
  static bool reusable_on(Block& block, const Stream& stream);
  void merge_free_neighbours(Block* block);
  [[noreturn]] void fail_out_of_memory(int64_t bytes);

  const int device_;
  std::mutex mutex_;
  FreeBlocks free_small_, free_large_;
  std::map<char*, Block*> live_;      // handed out
  std::vector<Block*> segments_;      // first block of each segment
  AllocatorStats stats_;
};

}  // namespace tessera::cuda
