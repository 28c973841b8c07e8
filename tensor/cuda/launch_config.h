// What a kernel launch needs on either runtime: the grid, the block, dynamic
// shared memory, the stream, and the device buffers the kernel reads and
// writes. Declaring the buffers is what lets the simulator bound-check every
// access, count the bytes a kernel moves, and order the launch against work
// on other streams.
#pragma once

#include <vector_types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cuda/kernel_operand.h"

namespace tessera {
class Stream;
}

namespace tessera::cuda {

enum class BufferAccess : uint8_t { read, write, read_write };

// The elements of a strided view, so that the simulator's memcheck holds an
// access to them and not merely to the span between the first and the last.
// Element offsets (in elements from the first) are sum(index[d] * strides[d])
// over index[d] < sizes[d], dims ordered by decreasing stride, each stride
// past the reach of the dims after it; a view that is not so nested (it
// overlaps itself) is described by its span alone.
struct StridedElements {
  int32_t element_bytes = 0;  // 0: every byte of the span is the buffer's
  int32_t dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  // Whether element offset `element` is one of the view's.
  bool contains(int64_t element) const {
    for (int32_t dim = 0; dim < dims; ++dim) {
      const int64_t index = element / strides[dim];
      if (index >= sizes[dim]) return false;
      element -= index * strides[dim];
    }
    return element == 0;
  }
  // The description of a view with `sizes` and `strides` (in elements), or a
  // dense one (element_bytes 0) when the view is dense or not nested.
  static StridedElements of(int64_t element_bytes, int32_t dims, const int64_t* sizes, const int64_t* strides);
};

// One device buffer a kernel touches: [data, data + bytes), and within it,
// for a strided view, only its elements.
struct BufferUse {
  std::string name;  // for messages: "out", "x", ...
  const void* data;
  int64_t bytes;
  BufferAccess access;
  StridedElements elements = {};
};

// Shared memory a block may take without its kernel's opt-in.
constexpr int64_t kSharedBytesWithoutOptIn = 48 * 1024;

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  int64_t dynamic_shared_bytes = 0;
  // More than kSharedBytesWithoutOptIn per block needs the kernel's opt-in
  // (cudaFuncAttributeMaxDynamicSharedMemorySize), as on the hardware.
  bool shared_memory_opt_in = false;
  std::vector<BufferUse> buffers;
  // Where the launch runs; required. CUDA's legacy default stream (a null
  // stream) is refused by both runtimes: it would serialise with every other
  // stream on the GPU, and the simulator's ordering checker could not see it.
  Stream* stream = nullptr;
};

}  // namespace tessera::cuda
