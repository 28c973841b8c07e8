// What the suites' own simulated kernel sources share to launch: a launch
// configuration on this thread's current cuda stream (the simulator refuses
// CUDA's legacy default stream, as the nvidia runtime does), waiting for it
// so that a kernel's error surfaces at the call, and a declared buffer of
// `count` elements. Included by the tests' .cu files
// (tests/cuda/simulator_kernels.cu, mma_kernels.cu).
#pragma once

#include <cstdint>

#include "tensor/cuda/launch_config.h"
#include "tensor/stream.h"

namespace tessera::testing {

inline cuda::LaunchConfig config(dim3 grid, dim3 block, int64_t shared = 0) {
  cuda::LaunchConfig launch;
  launch.grid = grid;
  launch.block = block;
  launch.dynamic_shared_bytes = shared;
  launch.stream = current_stream(Device(DeviceType::cuda)).get();
  return launch;
}

// Waits for the launch: its errors are thrown here.
inline void finish(const cuda::LaunchConfig& launch) { launch.stream->synchronize(); }

template <typename T>
cuda::BufferUse buffer(const char* name, const T* data, int64_t count, cuda::BufferAccess access) {
  return cuda::BufferUse{name, data, static_cast<int64_t>(sizeof(T)) * count, access};
}

}  // namespace tessera::testing
