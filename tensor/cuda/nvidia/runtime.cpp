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

bool has_fp8_gemm(int index) {
  int major = 0, minor = 0;
  nvidia::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index), "cudaDeviceGetAttribute");
  nvidia::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index), "cudaDeviceGetAttribute");
  return major * 10 + minor >= 89;
}

namespace {

thread_local int t_current_device = 0;

// Makes cuda:`device` current for one call, then restores the thread's own.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : restore_(t_current_device) {
    if (device != restore_) nvidia::check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = 0;
    if (cudaGetDevice(&now) == cudaSuccess && now != restore_) cudaSetDevice(restore_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int restore_;
};

}  // namespace

int device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void check_device_index(int index) {
  const int count = device_count();
  TESSERA_CHECK(index >= 0 && index < count, "there is no cuda:{}: this process sees {} GPU{}{}", index, count,
                count == 1 ? "" : "s", count == 0 ? "" : fmt::format(", cuda:0 to cuda:{}", count - 1));
}

void set_device(int index) {
  check_device_index(index);
  nvidia::check(cudaSetDevice(index), "cudaSetDevice");
  t_current_device = index;
}

int current_device() { return t_current_device; }

std::shared_ptr<Stream> create_stream(Device device, int priority) {
  return nvidia::NvidiaStream::create(device, priority);
}

void* device_malloc(int device, int64_t bytes) {
  const DeviceScope scope(device);
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, static_cast<size_t>(bytes));
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so the allocator can retry after emptying its cache
    return nullptr;
  }
  nvidia::check(status, "cudaMalloc");
  return pointer;
}

void device_free(int device, void* pointer) {
  const DeviceScope scope(device);
  nvidia::check(cudaFree(pointer), "cudaFree");
}

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

void check_host_access(const void*, int64_t, bool, const char*) {}

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
