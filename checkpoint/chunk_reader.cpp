// The overlap of a stored chunk with a held piece, read by byte range.
#include "checkpoint/chunk_reader.h"

#include <algorithm>
#include <filesystem>

#include "checkpoint/checksum.h"
#include "checkpoint/file_io.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

bool loads_into(DType stored, DType destination) {
  return stored == destination || (is_floating(stored) && is_floating(destination));
}

bool chunk_overlaps(const ChunkInfo& chunk, const Shape& piece_offsets, const Shape& piece_sizes) {
  for (size_t d = 0; d < chunk.sizes.size(); ++d) {
    if (std::max(chunk.offsets[d], piece_offsets[d]) >=
        std::min(chunk.offsets[d] + chunk.sizes[d], piece_offsets[d] + piece_sizes[d])) {
      return false;
    }
  }
  return true;
}

void read_chunk_overlap(const std::string& dir, const ChunkInfo& chunk, DType dtype, const std::string& tensor_name,
                        Tensor& piece, const Shape& piece_offsets) {
  const std::string path = (std::filesystem::path(dir) / chunk.file).string();
  TESSERA_CHECK(loads_into(dtype, piece.dtype()),
                "checkpoint::load: {}: '{}' is stored as {} and cannot load into {}: only a float loads into a float, "
                "an integer or bool only into its own dtype",
                path, tensor_name, dtype_name(dtype), dtype_name(piece.dtype()));
  const size_t ndim = chunk.sizes.size();
  Shape overlap_offset(ndim), overlap_size(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    const int64_t begin = std::max(chunk.offsets[d], piece_offsets[d]);
    const int64_t end =
        std::min(chunk.offsets[d] + chunk.sizes[d], piece_offsets[d] + piece.size(static_cast<int64_t>(d)));
    if (end <= begin) return;
    overlap_offset[d] = begin;
    overlap_size[d] = end - begin;
  }
  // The element span of the overlap inside the chunk: [first, last].
  const Shape strides = contiguous_strides(chunk.sizes);
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < ndim; ++d) {
    first += (overlap_offset[d] - chunk.offsets[d]) * strides[d];
    last += (overlap_offset[d] - chunk.offsets[d] + overlap_size[d] - 1) * strides[d];
  }
  const int64_t element = static_cast<int64_t>(element_size(dtype));
  const int64_t chunk_bytes = chunk.byte_end - chunk.byte_begin;
  const bool verified = !chunk.crc32c.empty();
  // Verified reads widen the span to whole checksum blocks.
  const int64_t unit = verified ? kChecksumBlock : element;
  const int64_t byte_begin = first * element / unit * unit;
  const int64_t byte_end = std::min(chunk_bytes, ((last + 1) * element + unit - 1) / unit * unit);

  Tensor destination = piece;
  for (size_t d = 0; d < ndim; ++d) {
    destination =
        ops::narrow(destination, static_cast<int64_t>(d), overlap_offset[d] - piece_offsets[d], overlap_size[d]);
  }
  // The common case (a shard loaded on the same layout, or whole rows of
  // one): the overlap is one contiguous run of the chunk, the destination is
  // contiguous, and the read needs no widening. Then the bytes go straight
  // into the destination and are verified there: no staging, no copy.
  const bool direct = destination.dtype() == dtype && destination.is_contiguous() &&
                      last - first + 1 == destination.numel() && byte_begin == first * element &&
                      byte_end == (last + 1) * element;
  Tensor span = direct ? destination : ops::empty({(byte_end - byte_begin) / element}, {.dtype = dtype});
  ReadFile(path).read_at(chunk.byte_begin + byte_begin, span.raw_data(), byte_end - byte_begin);
  if (verified) {
    const auto* bytes = static_cast<const uint8_t*>(span.raw_data());
    for (int64_t block = byte_begin / kChecksumBlock; block * kChecksumBlock < byte_end; ++block) {
      const int64_t begin = block * kChecksumBlock - byte_begin;
      const int64_t size = std::min(kChecksumBlock, chunk_bytes - block * kChecksumBlock);
      TESSERA_CHECK(crc32c(bytes + begin, static_cast<size_t>(size)) == chunk.crc32c.at(static_cast<size_t>(block)),
                    "checkpoint::load: {}: the bytes of '{}' (block {}) do not match their checksum (corrupt file)",
                    path, tensor_name, block);
    }
  }
  if (direct) return;
  const Tensor source = Tensor::make(span.storage(), overlap_size, strides, first - byte_begin / element, dtype);
  ops::copy_(destination, source);
}

void read_chunks(const std::string& dir, const std::vector<ChunkInfo>& chunks, DType dtype,
                 const std::string& tensor_name, Tensor piece, const Shape& piece_offsets) {
  if (piece.numel() == 0) return;
  const bool on_host = piece.device().is_cpu();
  Tensor target = on_host ? piece : ops::empty(piece.sizes(), {.dtype = piece.dtype(), .device = kCPU});
  for (const ChunkInfo& chunk : chunks) read_chunk_overlap(dir, chunk, dtype, tensor_name, target, piece_offsets);
  if (!on_host) ops::copy_(piece, target);  // host to device, once for the tensor
}

}  // namespace tessera::checkpoint
