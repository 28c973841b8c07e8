// The CPU allocator: aligned heap blocks, with a cache of large freed blocks.
// A training step frees and re-allocates the same large buffers every step
// (gradients, activations, logits); handing back a cached block saves the
// kernel's page faults and page zeroing, which otherwise cost as much as the
// step's non-GEMM math. Small blocks go straight to the C heap, which already
// recycles them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::cpu {

// At least 64-byte aligned; large blocks are huge-page aligned. Returns null
// when the system is out of memory (after releasing the cache and retrying).
void* allocate_bytes(size_t bytes);
// `bytes` must be the size passed to allocate_bytes.
void free_bytes(void* data, size_t bytes);
// Bytes held in the cache: freed by tensors, not yet returned to the system.
int64_t cached_bytes();
// Returns every cached block to the system.
void release_cached_blocks();

}  // namespace tessera::cpu
