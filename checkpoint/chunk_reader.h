// Reading part of a stored chunk: the box where a stored row-major chunk of a
// tensor overlaps the piece a rank holds. Only the bytes of that overlap are
// read (widened to whole checksum blocks when the chunk has checksums, so
// every byte read is verified), never the whole chunk or the whole tensor.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/metadata.h"
#include "tensor/tensor.h"

namespace tessera::checkpoint {

// Whether values stored as `stored` may load into a tensor of `destination`:
// a floating dtype into any floating one (converted on the way in), an
// integer or bool dtype only into itself. Token ids or masks turned into
// float parameters would be a silent change of meaning, not a load.
bool loads_into(DType stored, DType destination);

// Whether `chunk` and the piece of `piece_sizes` at `piece_offsets` share an element.
bool chunk_overlaps(const ChunkInfo& chunk, const Shape& piece_offsets, const Shape& piece_sizes);

// Copies the overlap of `chunk` (elements of `dtype`, in DIR/chunk.file)
// with `piece`, which holds the box of the same tensor that starts at
// `piece_offsets`, into `piece`, converting to its dtype (loads_into must
// allow it: callers check every tensor before reading any). An empty
// chunk.crc32c reads unverified (a safetensors file has no checksums). Does
// nothing when they do not overlap. Errors name the file and `tensor_name`
// (short reads, checksum mismatches).
void read_chunk_overlap(const std::string& dir, const ChunkInfo& chunk, DType dtype, const std::string& tensor_name,
                        Tensor& piece, const Shape& piece_offsets);

// Fills `piece` from the chunks that together hold the whole tensor: a host
// piece in place; a device piece is assembled in host memory and copied to
// the device once.
void read_chunks(const std::string& dir, const std::vector<ChunkInfo>& chunks, DType dtype,
                 const std::string& tensor_name, Tensor piece, const Shape& piece_offsets);

}  // namespace tessera::checkpoint
