// Device -> kernel table dispatch.
#include "tensor/kernels.h"

#include "tensor/device_runtime.h"

namespace tessera {

const KernelTable& kernels(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu::kernel_table();
    case DeviceType::meta:
      fail("kernels: meta tensors have no data to compute on (ops on meta stop after shape inference)");
    case DeviceType::cuda: return device_runtime(device).kernels(device);
  }
  fail("kernels: unknown device {}", device.str());
}

DType kernel_dtype(Device device, DType dtype) {
  if (dtype == DType::bf16 && !device.is_meta() && kernels(device).computes_bf16) return dtype;
  return compute_dtype(dtype);
}

}  // namespace tessera
