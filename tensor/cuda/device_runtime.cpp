// The cuda device's runtime table (tensor/device_runtime.h), the same for
// both runtimes: memory from the caching allocator, streams from the
// runtime of this build (tensor/cuda/runtime.h), copies through pinned
// host memory (tensor/cuda/transfer.h).
#include "tensor/device_runtime.h"

#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/transfer.h"
#include "tensor/kernels.h"

namespace tessera::cuda {

const DeviceRuntime& runtime_table() {
  static const DeviceRuntime table{
      .describe = [](Device device) { return describe_device(device.index); },
      .kernels = [](Device) -> const KernelTable& { return kernel_table(); },
      // On the allocating thread's current stream, as PyTorch does. The caller
      // goes unnamed: the allocator's out-of-memory error carries its statistics.
      .allocate = [](Device device, int64_t bytes, const char*) {
        return CachingAllocator::of(device.index).allocate(bytes, current_stream(device));
      },
      .free = [](Device device, void* data) { CachingAllocator::of(device.index).free(data); },
      .record_stream = [](Device device, void* data, const std::shared_ptr<Stream>& stream) {
        CachingAllocator::of(device.index).record_stream(data, stream);
      },
      .cached_bytes = [](Device device) {
        const AllocatorStats stats = CachingAllocator::of(device.index).stats();
        return stats.reserved_bytes - stats.allocated_bytes;
      },
      .release_cached_memory = [](Device device) { CachingAllocator::of(device.index).release_cached_memory(); },
      .create_stream = create_stream,
      .pinned_empty = pinned_host_empty,
      .copy_to_host_async = copy_device_to_host_async,
      .copy_from_host_async = copy_host_to_device_async,
      // Host memory only a copy could have touched: a cpu tensor with bytes.
      .check_host_access = [](const Tensor& host, bool writes, const char* operation) {
        if (host.defined() && host.device().is_cpu() && host.numel() > 0) {
          check_host_access(host.raw_data(), host.nbytes(), writes, operation);
        }
      },
  };
  return table;
}

}  // namespace tessera::cuda
