// Device names and parsing.
#include "tensor/device.h"

#include <charconv>

#include "tensor/cpu/float_vector.h"
#include "tensor/device_runtime.h"
#include "tensor/error.h"

namespace tessera {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return kCPU;
  if (text == "meta") return kMeta;
  if (text == "cuda") return Device(DeviceType::cuda, 0);
  if (text.starts_with("cuda:")) {
    std::string_view ordinal = text.substr(5);
    int index = -1;
    auto [end, error] = std::from_chars(ordinal.data(), ordinal.data() + ordinal.size(), index);
    if (error == std::errc() && end == ordinal.data() + ordinal.size() && index >= 0) {
      return Device(DeviceType::cuda, index);
    }
  }
  fail("unknown device '{}' (expected cpu, meta, cuda or cuda:N)", text);
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::meta: return "meta";
    case DeviceType::cuda: return fmt::format("cuda:{}", index);
  }
  return "?";
}

const char* cpu_instruction_set() { return cpu::FloatVector::kInstructionSet; }

std::string describe_device(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return fmt::format("cpu ({})", cpu_instruction_set());
    case DeviceType::meta: return "meta (shapes only, no data)";
    case DeviceType::cuda: return fmt::format("{} on {}", device.str(), device_runtime(device).describe(device));
  }
  return "?";
}

}  // namespace tessera
