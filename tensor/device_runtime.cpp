// Device -> device-runtime table dispatch (see tensor/device_runtime.h).
#include "tensor/device_runtime.h"

#include "tensor/error.h"

namespace tessera {

const DeviceRuntime& device_runtime(Device device) {
  switch (device.type) {
    case DeviceType::cuda: return cuda::runtime_table();
    case DeviceType::cpu:
    case DeviceType::meta: break;
  }
  fail("device_runtime: {} is served by the host, which has no device runtime", device.str());
}

}  // namespace tessera
