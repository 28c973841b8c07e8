// The launch limits of the GPU architectures tessera builds for. The simulator
// refuses a launch exactly where the hardware would, so a configuration that
// passes here also launches on the GPU.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera::cuda::sim {

// Statically declared __shared__ memory per block, on every architecture.
constexpr int64_t kMaxStaticSharedBytes = 48 * 1024;

struct Architecture {
  const char* name;                    // "sm_90"
  int max_threads_per_block;           // 1024 on every architecture here
  int64_t max_block_dim[3];            // x, y, z
  int64_t max_grid_dim[3];             // x, y, z
  int64_t default_shared_bytes;        // static + dynamic per block without opting in (48 KiB)
  int64_t max_shared_bytes_per_block;  // with cudaFuncAttributeMaxDynamicSharedMemorySize
};

// A100, H100 and B200 class parts.
const Architecture& sm_80();
const Architecture& sm_90();
const Architecture& sm_100();
// "sm_80", "sm_90" or "sm_100"; anything else is an error naming the choices.
const Architecture& architecture_named(std::string_view name);

// The architecture simulated launches are checked against (sm_90 unless set).
const Architecture& target_architecture();
void set_target_architecture(const Architecture& architecture);

}  // namespace tessera::cuda::sim
