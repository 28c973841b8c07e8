// The device bytes a piece of host code makes its kernels move, as the
// simulator counts them through its instrumentation: what the cuda suite
// holds memory-bound kernels to (at most 1.1x their ideal bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/device.h"
#include "tensor/stream.h"

namespace tessera::testing {

struct CountedBytes {
  int64_t read = 0, written = 0;
  int64_t total() const { return read + written; }
};

// The bytes of every launch `run` makes on cuda; nullopt where nothing
// counts (a GPU, or kernels that ASan instruments instead).
template <typename Run>
std::optional<CountedBytes> counted_bytes(Run run) {
  const Device cuda(DeviceType::cuda);
#if TESSERA_SIM_CHECKS
  current_stream(cuda)->synchronize();  // earlier launches count before the reset, not after
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(cuda)->synchronize();
  CountedBytes counted;
  for (const auto& [name, counter] : cuda::sim::kernel_counters()) {
    counted.read += counter.device_bytes_read;
    counted.written += counter.device_bytes_written;
  }
  return counted;
#else
  (void)cuda;
  run();
  return std::nullopt;
#endif
}

// The launches of each kernel `run` makes on cuda, by name, as the simulator
// counts them; empty on a GPU, where nothing counts.
inline std::map<std::string, int64_t> launch_counts(const std::function<void()>& run) {
  std::map<std::string, int64_t> counts;
#if TESSERA_HAVE_CUDA_SIM
  const Device cuda(DeviceType::cuda);
  current_stream(cuda)->synchronize();
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(cuda)->synchronize();
  for (const auto& [name, counter] : cuda::sim::kernel_counters()) counts[name] = counter.launches;
#else
  run();
#endif
  return counts;
}

// The names of the kernels `run` launches on cuda, as the simulator counts
// them (sorted); empty on a GPU, where nothing counts.
inline std::vector<std::string> launched_kernels(const std::function<void()>& run) {
  std::vector<std::string> names;
  for (const auto& [name, launches] : launch_counts(run)) names.push_back(name);
  return names;
}

}  // namespace tessera::testing
