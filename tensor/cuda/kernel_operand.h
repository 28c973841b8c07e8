// How a cuda kernel sees a tensor: its device address, element type and
// strided layout, passed to the kernel by value. Plain data, so that nvcc
// compiles it for the device and the simulator for the host.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace tessera::cuda {

constexpr int kMaxDims = 8;

struct Layout {
  int32_t dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements; 0 along a broadcast dim

  // The element offset of logical (row-major) index `index`. Indices below
  // 2^32 take 32-bit division, which the GPU inlines; a 64-bit one is a call
  // whose saved registers ptxas reports as spills.
  TESSERA_HOST_DEVICE int64_t offset(int64_t index) const {
    int64_t result = 0;
    uint64_t rest = static_cast<uint64_t>(index);
    for (int32_t dim = dims - 1; dim >= 0; --dim) {
      const uint64_t size = static_cast<uint64_t>(sizes[dim]);
      uint64_t quotient;
      if ((rest | size) >> 32 == 0) {
        quotient = static_cast<uint32_t>(rest) / static_cast<uint32_t>(size);
      } else {
        quotient = rest / size;
      }
      result += static_cast<int64_t>(rest - quotient * size) * strides[dim];
      rest = quotient;
    }
    return result;
  }
};

struct Operand {
  void* data = nullptr;  // the first element
  DType dtype = DType::f32;
  int64_t count = 0;        // elements
  bool contiguous = false;  // row-major and dense: element i is at data + i
  Layout layout;
};

}  // namespace tessera::cuda
