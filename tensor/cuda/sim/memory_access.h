// Every load and store a simulated kernel makes passes through check_access:
// the kernel sources are compiled with GCC's thread-sanitizer instrumentation
// and tessera supplies the hooks it calls (instrumentation_hooks.cpp), so
// nothing in a kernel is rewritten. A device access must fall inside a
// buffer the launch declared, with the declared access (memcheck), and is
// counted; a shared-memory access goes through racecheck. Accesses outside
// kernels, and to a kernel's own stack, pass untouched.
#pragma once

#include <cstdint>

#include "tensor/cuda/sim/shared_memory_racecheck.h"

namespace tessera::cuda::sim {

void check_access(const void* address, int64_t bytes, AccessKind kind);

}  // namespace tessera::cuda::sim
