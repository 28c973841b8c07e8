// The one header a kernel source (.cu) includes. nvcc compiles the source for
// the GPU; in the simulator build g++ compiles the same file as C++, and this
// header maps CUDA's built-ins (threadIdx, __syncthreads, the warp
// operations, __shared__; the device function library is in
// sim/device_functions.h) onto tessera::cuda::sim. Kernels are plain CUDA
// C++ plus one spelling of ours, TESSERA_LAUNCH for a launch (nvcc's <<<>>>
// is not C++). `extern __shared__` arrays work as written (the simulator's
// kernel units respell them as dynamic_shared_memory<T>(), which kernels may
// also call).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include "tensor/cuda/launch_config.h"

#if defined(__CUDACC__)

#include "tensor/cuda/nvidia/launch.h"

// Shared memory sized at launch (LaunchConfig::dynamic_shared_bytes).
template <typename T>
__device__ __forceinline__ T* dynamic_shared_memory() {
  extern __shared__ __align__(16) unsigned char tessera_dynamic_shared[];
  return reinterpret_cast<T*>(tessera_dynamic_shared);
}

#define TESSERA_LAUNCH(kernel, config, ...) ::tessera::cuda::nvidia::launch(#kernel, kernel, config, __VA_ARGS__)

#else  // the simulator

#include <atomic>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "tensor/cuda/sim/device_functions.h"
#include "tensor/cuda/sim/intrinsics.h"
#include "tensor/cuda/sim/launch.h"

// Static shared memory is per OS thread, and a block's fibers all run on one
// OS thread, one block at a time; the simulator poisons what a block touched
// before the next one runs, and initcheck reports a read of a byte the block
// did not write.
#undef __shared__
#define __shared__ thread_local
#define __launch_bounds__(...)
#define __restrict__ __restrict

#define threadIdx (::tessera::cuda::sim::thread_index())
#define blockIdx (::tessera::cuda::sim::block_index())
#define blockDim (::tessera::cuda::sim::block_dim())
#define gridDim (::tessera::cuda::sim::grid_dim())
constexpr int warpSize = 32;

inline void __syncthreads(std::source_location site = std::source_location::current()) {
  ::tessera::cuda::sim::sync_threads(site);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location site = std::source_location::current()) {
  ::tessera::cuda::sim::warp_operation(::tessera::cuda::sim::WarpOp::syncwarp, mask, 0, 0, warpSize, site);
}
inline unsigned __activemask() { return ::tessera::cuda::sim::active_mask(); }

namespace tessera::cuda::sim {
// The toolkit's 16-bit float types and their pairs have user-written copy
// operations, so they are not trivially copyable; their bits are the value,
// so shuffle copies them as bytes (through void*, which tells g++ so:
// -Wclass-memaccess).
template <typename T>
concept ShuffledBits = sizeof(T) <= sizeof(uint64_t) &&
                       (std::is_trivially_copyable_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __half2> ||
                        std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __nv_bfloat162>);

template <typename T>
T shuffle(WarpOp op, unsigned mask, T value, int argument, int width, std::source_location site) {
  static_assert(ShuffledBits<T>, "__shfl_*_sync of a type wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = warp_operation(op, mask, bits, argument, width, site);
  std::memcpy(static_cast<void*>(&value), &bits, sizeof(T));
  return value;
}
}  // namespace tessera::cuda::sim

template <typename T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = warpSize,
              std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::shuffle(::tessera::cuda::sim::WarpOp::shfl, mask, value, source_lane, width, site);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize,
                 std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::shuffle(::tessera::cuda::sim::WarpOp::shfl_up, mask, value, static_cast<int>(delta),
                                       width, site);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize,
                   std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::shuffle(::tessera::cuda::sim::WarpOp::shfl_down, mask, value, static_cast<int>(delta),
                                       width, site);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize,
                  std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::shuffle(::tessera::cuda::sim::WarpOp::shfl_xor, mask, value, lane_mask, width, site);
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location site = std::source_location::current()) {
  return static_cast<unsigned>(::tessera::cuda::sim::warp_operation(::tessera::cuda::sim::WarpOp::ballot, mask,
                                                                    predicate != 0, 0, warpSize, site));
}
inline int __any_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
  return static_cast<int>(
      ::tessera::cuda::sim::warp_operation(::tessera::cuda::sim::WarpOp::any, mask, predicate != 0, 0, warpSize, site));
}
inline int __all_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
  return static_cast<int>(
      ::tessera::cuda::sim::warp_operation(::tessera::cuda::sim::WarpOp::all, mask, predicate != 0, 0, warpSize, site));
}

// The lanes of `mask` whose value equals the caller's; and the mask when all
// are equal (setting *pred), else 0.
template <typename T>
  requires(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8))
unsigned __match_any_sync(unsigned mask, T value, std::source_location site = std::source_location::current()) {
  return static_cast<unsigned>(::tessera::cuda::sim::warp_operation(
      ::tessera::cuda::sim::WarpOp::match_any, mask, static_cast<uint64_t>(value), 0, warpSize, site));
}
template <typename T>
  requires(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8))
unsigned __match_all_sync(unsigned mask, T value, int* pred,
                          std::source_location site = std::source_location::current()) {
  const auto result = static_cast<unsigned>(::tessera::cuda::sim::warp_operation(
      ::tessera::cuda::sim::WarpOp::match_all, mask, static_cast<uint64_t>(value), 0, warpSize, site));
  *pred = result != 0;
  return result;
}

namespace tessera::cuda::sim {
inline uint32_t reduce_sync(ReduceOp op, unsigned mask, uint32_t value, std::source_location site) {
  return static_cast<uint32_t>(warp_operation(WarpOp::reduce, mask, value, static_cast<int>(op), warpSize, site));
}
}  // namespace tessera::cuda::sim

// sm_80's warp reductions of 32-bit integers.
#define TESSERA_REDUCE_SYNC(name, type, op)                                                                   \
  inline type name(unsigned mask, type value, std::source_location site = std::source_location::current()) { \
    return static_cast<type>(::tessera::cuda::sim::reduce_sync(::tessera::cuda::sim::ReduceOp::op, mask,      \
                                                               static_cast<uint32_t>(value), site));          \
  }
TESSERA_REDUCE_SYNC(__reduce_add_sync, unsigned, add_unsigned)
TESSERA_REDUCE_SYNC(__reduce_add_sync, int, add_signed)
TESSERA_REDUCE_SYNC(__reduce_min_sync, unsigned, min_unsigned)
TESSERA_REDUCE_SYNC(__reduce_min_sync, int, min_signed)
TESSERA_REDUCE_SYNC(__reduce_max_sync, unsigned, max_unsigned)
TESSERA_REDUCE_SYNC(__reduce_max_sync, int, max_signed)
TESSERA_REDUCE_SYNC(__reduce_and_sync, unsigned, bit_and)
TESSERA_REDUCE_SYNC(__reduce_or_sync, unsigned, bit_or)
TESSERA_REDUCE_SYNC(__reduce_xor_sync, unsigned, bit_xor)
#undef TESSERA_REDUCE_SYNC

// __syncthreads with a block-wide vote.
inline int __syncthreads_count(int predicate, std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::sync_threads_count(predicate, site);
}
inline int __syncthreads_and(int predicate, std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::sync_threads_count(predicate, site) ==
         static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int predicate, std::source_location site = std::source_location::current()) {
  return ::tessera::cuda::sim::sync_threads_count(predicate, site) != 0;
}

template <typename T>
T* dynamic_shared_memory() {
  return static_cast<T*>(::tessera::cuda::sim::dynamic_shared_memory());
}

#define TESSERA_LAUNCH(kernel, config, ...)                                                                   \
  ::tessera::cuda::sim::launch(#kernel, reinterpret_cast<const void*>(&kernel), config,                       \
                               [=] { kernel(__VA_ARGS__); })

#endif
