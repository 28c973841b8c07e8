// What the OS thread running a simulated launch knows about it: the kernel,
// its configuration, the shared-memory windows and their racecheck, and the
// counters. The block scheduler, the intrinsics and the memory checks reach
// it through current_launch(); simulator-internal.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tensor/cuda/launch_config.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/cuda/sim/shared_memory_racecheck.h"

namespace tessera::cuda::sim {

class ThreadBlock;

// [begin, begin + bytes) of this OS thread's memory.
struct Window {
  uintptr_t begin = 0;
  int64_t bytes = 0;
  bool contains(uintptr_t address) const { return address - begin < static_cast<uint64_t>(bytes); }
};

struct LaunchState {
  std::string kernel_name;
  const LaunchConfig* config = nullptr;
  const std::function<void()>* thread_body = nullptr;
  // __shared__ variables are thread_local, so they live in this OS thread's
  // TLS block of the kernel's module.
  Window static_shared;
  // The block's dynamic shared memory is the first dynamic_shared_bytes of
  // this window; the rest is a red zone.
  Window dynamic_shared;
  int64_t dynamic_shared_bytes = 0;
  SharedMemoryRacecheck static_racecheck;
  SharedMemoryRacecheck dynamic_racecheck;
  KernelCounters counters;
  ThreadBlock* block = nullptr;  // the block running now
};

// The launch this OS thread is running, or nullptr outside kernels.
LaunchState* current_launch();
void set_current_launch(LaunchState* launch);

}  // namespace tessera::cuda::sim
