// checkpoint::crc32c: the CRC-32C (Castagnoli) of a byte range, the checksum
// every chunk of a checkpoint carries so that truncated or flipped bytes are
// found before they are loaded. The CPU's crc32 instruction where it has one
// (x86 SSE4.2), else slicing-by-8 tables.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::checkpoint {

// Extends `crc` (0 to start) over `size` bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The table version, on every CPU (tests compare the two).
uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc = 0);

}  // namespace tessera::checkpoint
