// Device -> kernel table dispatch.
#include "tensor/kernels.h"

namespace tessera {

const KernelTable& kernels(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu::kernel_table();
    case DeviceType::meta:
      fail("kernels: meta tensors have no data to compute on (ops on meta stop after shape inference)");
    case DeviceType::cuda:
#if TESSERA_HAVE_CUDA
      return cuda::kernel_table();
#else
      break;
#endif
  }
  fail("kernels: no kernels for {} in this build (configure on a machine with the CUDA toolkit and Boost.Context)",
       device.str());
}

DType kernel_dtype(Device device, DType dtype) {
  if (dtype == DType::bf16 && !device.is_meta() && kernels(device).computes_bf16) return dtype;
  return compute_dtype(dtype);
}

}  // namespace tessera
