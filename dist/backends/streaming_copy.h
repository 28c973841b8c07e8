// Copies for collectives whose output cannot stay in cache. Non-temporal
// ("streaming") stores write whole cache lines straight to memory: no
// read-for-ownership of the destination and no eviction of the sources that
// peers are about to read, which is most of a large all-gather's cost.
#pragma once

#include <cstdint>

namespace tessera::dist {

// True when a collective writing `bytes` in total (all ranks together) should
// use streaming stores: it writes more than the last-level cache holds.
bool should_stream(int64_t bytes);

// dst[0, bytes) = src[0, bytes) with streaming stores (memcpy where the CPU has
// none). The ranges must not overlap.
void copy_streaming(void* dst, const void* src, int64_t bytes);

// Orders this thread's streaming stores before its later stores, so a peer
// that sees the release of a result also sees its bytes. Call before
// announcing that streamed data is complete.
void streaming_fence();

}  // namespace tessera::dist
