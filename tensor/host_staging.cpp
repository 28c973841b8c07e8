// Pinned host tensors and asynchronous copies between them and a device:
// the host and the build's one device runtime, the cuda device's
// (tensor/device_runtime.h), which in a build without one refuses the copies
// and pins nothing.
#include "tensor/host_staging.h"

#include "tensor/device_runtime.h"

namespace tessera {

Tensor pinned_empty(const Shape& sizes, DType dtype) { return cuda::runtime_table().pinned_empty(sizes, dtype); }

Event copy_to_host_async(const Tensor& host, const Tensor& device, Stream& stream) {
  return cuda::runtime_table().copy_to_host_async(host, device, stream);
}

void check_host_access(const Tensor& host, bool writes, const char* operation) {
  cuda::runtime_table().check_host_access(host, writes, operation);
}

Event copy_from_host_async(const Tensor& device, const Tensor& host, Stream& stream) {
  return cuda::runtime_table().copy_from_host_async(device, host, stream);
}

}  // namespace tessera
