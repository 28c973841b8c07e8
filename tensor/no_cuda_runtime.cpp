// The cuda device's runtime table in a build without a cuda runtime
// (tensor/device_runtime.h): what needs the device raises a tessera::Error
// naming it and how to configure a build that has one; what only asks about
// it (statistics, the host's checks) finds nothing, and pinned host memory
// is ordinary memory.
#include "tensor/device_runtime.h"

#include "tensor/error.h"
#include "tensor/ops.h"

namespace tessera::cuda {

const DeviceRuntime& runtime_table() {
  static const DeviceRuntime table{
      .describe = [](Device device) -> std::string {
        fail("{}: this build has no cuda runtime (configure with the CUDA toolkit: -Dgpu_runtime=sim, the default, "
             "or -Dgpu_runtime=nvidia)",
             device.str());
      },
      .kernels = [](Device device) -> const KernelTable& {
        fail("kernels: no kernels for {} in this build (configure on a machine with the CUDA toolkit and "
             "Boost.Context)",
             device.str());
      },
      .allocate = [](Device device, int64_t, const char* caller) -> void* {
        fail("{}: no allocator for device {} in this build (configure with the CUDA toolkit for the cuda device)",
             caller, device.str());
      },
      // Nothing was allocated: nothing to give back, cache or order.
      .free = [](Device, void*) {},
      .record_stream = [](Device, void*, const std::shared_ptr<Stream>&) {},
      .cached_bytes = [](Device) -> int64_t { return 0; },
      .release_cached_memory = [](Device) {},
      .create_stream = [](Device, int) -> std::shared_ptr<Stream> {
        fail("Stream: no cuda runtime in this build (configure with the CUDA toolkit for the simulator)");
      },
      .pinned_empty = [](const Shape& sizes, DType dtype) {
        return ops::empty(sizes, {.dtype = dtype, .device = kCPU});
      },
      .copy_to_host_async = [](const Tensor&, const Tensor& device, Stream&) -> Event {
        fail("copy_to_host_async: {} is not a device of this build", device.device().str());
      },
      .copy_from_host_async = [](const Tensor& device, const Tensor&, Stream&) -> Event {
        fail("copy_from_host_async: {} is not a device of this build", device.device().str());
      },
      // No copy can have touched host memory.
      .check_host_access = [](const Tensor&, bool, const char*) {},
  };
  return table;
}

}  // namespace tessera::cuda
