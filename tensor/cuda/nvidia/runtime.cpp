// The nvidia runtime under the cuda device: cudaMalloc, pinned host memory,
// cudaMemcpyAsync on tessera's streams, and the launch helpers nvcc's side
// of tensor/cuda/portability.h calls.
#include "tensor/cuda/runtime.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "tensor/cuda/nvidia/launch.h"
#include "tensor/cuda/nvidia/nvidia_stream.h"
#include "tensor/error.h"

namespace tessera::cuda {

const char* runtime_name() { return "nvidia"; }

std::string describe_device(int index) {
  cudaDeviceProp properties{};
  nvidia::check(cudaGetDeviceProperties(&properties, index), "cudaGetDeviceProperties");
  return fmt::format("{} (sm_{}{}, {:.1f} GiB, {} multiprocessors), nvidia runtime", properties.name, properties.major,
                     properties.minor, static_cast<double>(properties.totalGlobalMem) / (1 << 30),
                     properties.multiProcessorCount);
}

void* device_malloc(int64_t bytes) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, static_cast<size_t>(bytes));
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so the allocator can retry after emptying its cache
    return nullptr;
  }
  nvidia::check(status, "cudaMalloc");
  return pointer;
}

void device_free(void* pointer) { nvidia::check(cudaFree(pointer), "cudaFree"); }

void* pinned_host_malloc(int64_t bytes) {
  void* pointer = nullptr;
  nvidia::check(cudaHostAlloc(&pointer, static_cast<size_t>(bytes), cudaHostAllocDefault), "cudaHostAlloc");
  return pointer;
}

void pinned_host_free(void* pointer) { nvidia::check(cudaFreeHost(pointer), "cudaFreeHost"); }

void* mapped_host_malloc(int64_t bytes) {
  void* host = nullptr;
  nvidia::check(cudaHostAlloc(&host, static_cast<size_t>(bytes), cudaHostAllocMapped), "cudaHostAlloc (mapped)");
  void* device = nullptr;
  nvidia::check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
  TESSERA_CHECK(device == host, "cuda: mapped host memory has another device address (no unified addressing)");
  return host;
}

void memcpy_async(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream& stream) {
  const cudaMemcpyKind direction = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                                   : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                                      : cudaMemcpyDeviceToDevice;
  nvidia::check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), direction,
                                nvidia::native_stream(&stream, "memcpy_async")),
                "cudaMemcpyAsync");
}

namespace nvidia {

cudaStream_t native_stream(Stream* stream, const char* kernel) {
  auto* nvidia_stream = dynamic_cast<NvidiaStream*>(stream);
  TESSERA_CHECK(nvidia_stream != nullptr, "launch of `{}`: needs a cuda stream (never the legacy default stream), got {}",
                kernel, stream == nullptr ? "none" : stream->device().str());
  return nvidia_stream->native();
}

void check_launch(cudaError_t status, const char* kernel) {
  TESSERA_CHECK(status == cudaSuccess, "launch of `{}`: {} ({})", kernel, cudaGetErrorString(status),
                cudaGetErrorName(status));
}

}  // namespace nvidia

}  // namespace tessera::cuda
