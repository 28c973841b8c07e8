// Reading part of a stored chunk: the box where a stored row-major chunk of a
// tensor overlaps the piece a rank holds. Only the bytes of that overlap are
// read (widened to whole checksum blocks when the chunk has checksums, so
// every byte read is verified), never the whole chunk or the whole tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tessera::checkpoint {

// A chunk as it lies on disk: the box [offsets, offsets + sizes) of its tensor,
// stored row-major at the absolute bytes [byte_begin, byte_end) of `path`.
struct StoredChunk {
  std::string path;
  int64_t byte_begin = 0;
  int64_t byte_end = 0;
  Shape offsets;
  Shape sizes;
  // CRC-32C of each kChecksumBlock bytes of the chunk; empty: not verified.
  const std::vector<uint32_t>* crc32c = nullptr;
};

// Copies the overlap of `chunk` (elements of `dtype`) with `piece`, which holds
// the box of the same tensor that starts at `piece_offsets`, into `piece`
// (same dtype). Does nothing when they do not overlap. Errors name `path` and
// `tensor_name` (short reads, checksum mismatches).
void read_chunk_overlap(const StoredChunk& chunk, DType dtype, const std::string& tensor_name, Tensor& piece,
                        const Shape& piece_offsets);

}  // namespace tessera::checkpoint
