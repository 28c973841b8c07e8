// nvcc's side of TESSERA_LAUNCH: the same LaunchConfig the simulator takes,
// turned into cudaLaunchKernel on the stream's cudaStream_t (never the
// legacy default stream), with the shared-memory opt-in applied first and
// the launch's error checked at once.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <tuple>
#include <utility>

#include "tensor/cuda/launch_config.h"

namespace tessera::cuda::nvidia {

// The cudaStream_t of a cuda Stream (an error for any other).
cudaStream_t native_stream(Stream* stream, const char* kernel);
// Throws tessera::Error naming the kernel and CUDA's message.
void check_launch(cudaError_t status, const char* kernel);

template <typename... Params, typename... Args>
void launch(const char* kernel_name, void (*kernel)(Params...), const LaunchConfig& config, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "TESSERA_LAUNCH: wrong number of kernel arguments");
  const cudaStream_t stream = native_stream(config.stream, kernel_name);
  if (config.shared_memory_opt_in) {
    check_launch(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(config.dynamic_shared_bytes)),
                 kernel_name);
  }
  // Each argument converted to the kernel's parameter type, then by address.
  std::tuple<Params...> values(std::forward<Args>(args)...);
  std::array<void*, sizeof...(Params) + 1> pointers = std::apply(
      [](auto&... value) { return std::array<void*, sizeof...(Params) + 1>{static_cast<void*>(&value)..., nullptr}; },
      values);
  check_launch(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), config.grid, config.block, pointers.data(),
                                static_cast<size_t>(config.dynamic_shared_bytes), stream),
               kernel_name);
}

}  // namespace tessera::cuda::nvidia
