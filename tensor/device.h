// Where a tensor's bytes live. `meta` tensors have shape and dtype but no
// bytes: every op runs on them as shape inference, so a model can be built,
// sharded and even run forward before any memory is committed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

enum class DeviceType : uint8_t { cpu, cuda, meta };

constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // the GPU ordinal for cuda; 0 elsewhere

  constexpr Device() = default;
  constexpr Device(DeviceType device_type, int device_index = 0) : type(device_type), index(device_index) {}
  // Parses "cpu", "meta", "cuda", "cuda:3"; throws on anything else.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_meta() const { return type == DeviceType::meta; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

inline constexpr Device kCPU{DeviceType::cpu};
inline constexpr Device kMeta{DeviceType::meta};

// What runs `device`, in one line: the cpu's instruction set, or for cuda the
// GPU (nvidia runtime) or the simulator, which says that it is simulated.
// Throws tessera::Error for cuda in a build without a cuda runtime.
std::string describe_device(Device device);

// The vector instruction set the CPU kernels (and Eigen's GEMM) were compiled
// for (-Dmarch): "AVX-512", "AVX2+FMA", "AVX", "SSE2" or "scalar".
const char* cpu_instruction_set();

}  // namespace tessera
