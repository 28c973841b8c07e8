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

  // The element offset of logical (row-major) index `index`.
  TESSERA_HOST_DEVICE int64_t offset(int64_t index) const {
    int64_t result = 0;
    for (int32_t dim = dims - 1; dim >= 0; --dim) {
      result += index % sizes[dim] * strides[dim];
      index /= sizes[dim];
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
