// Pinned host tensors and asynchronous device-to-host copies, dispatched to
// the cuda runtime when the build has one.
#include "tensor/host_staging.h"

#include "tensor/error.h"
#include "tensor/ops.h"
#if TESSERA_HAVE_CUDA
#include "tensor/cuda/transfer.h"
#endif

namespace tessera {

Tensor pinned_empty(const Shape& sizes, DType dtype) {
#if TESSERA_HAVE_CUDA
  return cuda::pinned_host_empty(sizes, dtype);
#else
  return ops::empty(sizes, {.dtype = dtype, .device = kCPU});
#endif
}

Event copy_to_host_async([[maybe_unused]] const Tensor& host, const Tensor& device, [[maybe_unused]] Stream& stream) {
#if TESSERA_HAVE_CUDA
  return cuda::copy_device_to_host_async(host, device, stream);
#else
  fail("copy_to_host_async: {} is not a device of this build", device.device().str());
#endif
}

}  // namespace tessera
