#include "tensor/cuda/sim/architecture.h"

#include <atomic>

#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

// CUDA C++ Programming Guide, "Technical Specifications per Compute
// Capability": 1024 threads per block, block dims 1024 x 1024 x 64, grid dims
// (2^31 - 1) x 65535 x 65535, 48 KiB of shared memory per block unless the
// kernel opts in to more (163 KiB on 8.0, 227 KiB on 9.0 and 10.0).
constexpr Architecture make(const char* name, int64_t max_shared_kib) {
  return Architecture{name, 1024, {1024, 1024, 64}, {2147483647, 65535, 65535}, 48 * 1024, max_shared_kib * 1024};
}

constexpr Architecture kSm80 = make("sm_80", 163);
constexpr Architecture kSm90 = make("sm_90", 227);
constexpr Architecture kSm100 = make("sm_100", 227);

std::atomic<const Architecture*> target{&kSm90};

}  // namespace

const Architecture& sm_80() { return kSm80; }
const Architecture& sm_90() { return kSm90; }
const Architecture& sm_100() { return kSm100; }

const Architecture& architecture_named(std::string_view name) {
  for (const Architecture* architecture : {&kSm80, &kSm90, &kSm100}) {
    if (name == architecture->name) return *architecture;
  }
  fail("cuda sim: unknown architecture '{}' (expected sm_80, sm_90 or sm_100)", name);
}

const Architecture& target_architecture() { return *target.load(); }
void set_target_architecture(const Architecture& architecture) { target.store(&architecture); }

}  // namespace tessera::cuda::sim
