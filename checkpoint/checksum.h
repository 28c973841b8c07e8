// checkpoint::crc32c: the CRC-32C (Castagnoli) of a byte range, the checksum
// every chunk of a checkpoint carries so that truncated or flipped bytes are
// found before they are loaded. Slicing-by-8 tables: several GB/s in software.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::checkpoint {

// Extends `crc` (0 to start) over `size` bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace tessera::checkpoint
