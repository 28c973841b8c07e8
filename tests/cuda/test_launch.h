// What the suites' own simulated kernel sources share to launch: a launch
// configuration and a declared buffer of `count` elements. Included by the
// tests' .cu files (tests/cuda/simulator_kernels.cu, mma_kernels.cu).
#pragma once

#include <cstdint>

#include "tensor/cuda/launch_config.h"

namespace tessera::testing {

inline cuda::LaunchConfig config(dim3 grid, dim3 block, int64_t shared = 0) {
  cuda::LaunchConfig launch;
  launch.grid = grid;
  launch.block = block;
  launch.dynamic_shared_bytes = shared;
  return launch;
}

template <typename T>
cuda::BufferUse buffer(const char* name, const T* data, int64_t count, cuda::BufferAccess access) {
  return cuda::BufferUse{name, data, static_cast<int64_t>(sizeof(T)) * count, access};
}

}  // namespace tessera::testing
