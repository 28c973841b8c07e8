// Device -> kernel table dispatch.
#include "tensor/kernels.h"

namespace tessera {

const KernelTable& kernels(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu::kernel_table();
    case DeviceType::meta:
      fail("kernels: meta tensors have no data to compute on (ops on meta stop after shape inference)");
    case DeviceType::cuda: break;
  }
  fail("kernels: no kernels for {} in this build (configure with -Dcuda=enabled on a machine with the CUDA toolkit)",
       device.str());
}

}  // namespace tessera
