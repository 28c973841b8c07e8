// Every load and store a simulated kernel makes passes through check_access:
// the kernel sources are compiled with GCC's thread-sanitizer instrumentation
// and tessera supplies the hooks it calls (instrumentation_hooks.cpp), so
// nothing in a kernel is rewritten. A device access must fall on the
// elements of an operand the launch declared, with the declared access, and
// be aligned as the hardware requires (memcheck); a read must find its bytes
// written (initcheck); a shared-memory access goes through racecheck. Faults
// that would corrupt memory on the GPU end the block; races and unwritten
// reads are reported when the launch ends, all of them. Accesses outside
// kernels, and to a kernel's own stack, pass untouched.
#pragma once

#include <cstdint>

#include "tensor/cuda/sim/code_site.h"
#include "tensor/cuda/sim/shared_memory_racecheck.h"

namespace tessera::cuda::sim {

// `naturally_aligned`: the compiler assumed the address a multiple of
// `bytes` (every access but a packed struct's or a memcpy's), which the GPU
// requires of every load and store.
void check_access(const void* address, int64_t bytes, AccessKind kind, const CodeSite& site,
                  bool naturally_aligned = true);

// A typed access the compiler checked for its type's alignment and found
// misaligned (UBSan's alignment check on the kernel units): a fault inside
// a kernel. `check_kind` is UBSan's (0 load, 1 store, 3 member access, ...).
void check_typed_alignment(const void* address, int64_t alignment, const char* type, int check_kind,
                           const char* file, uint32_t line);

// A volatile load or an atomic just made at `site`, `stored` when it changed
// memory: a point where a spinning thread lets the others run.
void memory_poll(const CodeSite& site, bool stored);

// Settles a store racecheck held back (PendingWrite): called before the
// running thread makes another access, waits or exits.
void settle_pending_write();

// Whether racecheck reports same-value write-after-write hazards (several
// threads storing the value already there, which the hardware makes benign
// and common code relies on). Off unless TESSERA_SIM_STRICT_RACECHECK=1 or set here.
bool strict_racecheck();
void set_strict_racecheck(bool strict);

}  // namespace tessera::cuda::sim
