// Host entry point of the multi-tensor copy (tensor/cuda/multi_tensor.cu):
// a list of segments, each a dense copy with a float conversion or a fill,
// moved by one launch per kSegmentsPerLaunch segments. The segment table
// travels by value in the kernel's argument (under the 4 KiB that every CUDA
// version and the simulator take). Blocks are spread over the segments in
// proportion to their sizes: each block moves one chunk of one segment, and
// the chunk grows with the launch's elements so that the grid stays near
// kMaxBlocks however large the list is.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

constexpr int kSegmentsPerLaunch = 128;

// One segment: `count` elements of dst (f32, f64, bf16 or f16, dense) from
// src (dense, a float dtype, converted as the copy kernel converts), or, with
// src null, `value` converted to dst's dtype as the fill kernel converts it;
// `buffers` declares the bytes it touches.
struct SegmentOperand {
  void* dst = nullptr;
  DType dst_dtype = DType::f32;
  const void* src = nullptr;
  DType src_dtype = DType::f32;
  double value = 0.0;
  int64_t count = 0;
  std::vector<BufferUse> buffers;
};

// Every segment, in launches of up to kSegmentsPerLaunch non-empty ones on
// `stream`. Segments must not overlap one another's destinations or sources
// (ops::copy_segments checks): blocks run in no order.
void copy_segments(const std::vector<SegmentOperand>& segments, Stream* stream);

}  // namespace tessera::cuda
