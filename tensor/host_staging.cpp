// Pinned host tensors and asynchronous device-to-host copies, dispatched to
// the cuda runtime when the build has one.
#include "tensor/host_staging.h"

#include "tensor/error.h"
#include "tensor/ops.h"
#if TESSERA_HAVE_CUDA
#include "tensor/cuda/runtime.h"
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

void check_host_access([[maybe_unused]] const Tensor& host, [[maybe_unused]] bool writes,
                       [[maybe_unused]] const char* operation) {
#if TESSERA_HAVE_CUDA
  if (host.defined() && host.device().is_cpu() && host.numel() > 0) {
    cuda::check_host_access(static_cast<const char*>(host.raw_data()), host.nbytes(), writes, operation);
  }
#endif
}

Event copy_from_host_async(const Tensor& device, [[maybe_unused]] const Tensor& host,
                           [[maybe_unused]] Stream& stream) {
#if TESSERA_HAVE_CUDA
  return cuda::copy_host_to_device_async(device, host, stream);
#else
  fail("copy_from_host_async: {} is not a device of this build", device.device().str());
#endif
}

}  // namespace tessera
