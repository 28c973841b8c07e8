#include "tensor/cuda/sim/memory_access.h"

#include "tensor/cuda/sim/architecture.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/launch_state.h"
#include "tensor/cuda/sim/thread_block.h"
#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

const char* verb(AccessKind kind) {
  switch (kind) {
    case AccessKind::read: return "reads";
    case AccessKind::write: return "writes";
    case AccessKind::atomic: return "atomically updates";
  }
  return "?";
}

const char* access_name(BufferAccess access) {
  switch (access) {
    case BufferAccess::read: return "read-only";
    case BufferAccess::write: return "write-only (declare it read_write to read it)";
    case BufferAccess::read_write: return "read_write";
  }
  return "?";
}

void check_device_access(LaunchState& launch, uintptr_t address, int64_t bytes, AccessKind kind) {
  ThreadBlock& block = *launch.block;
  const auto who = [&] {  // only formatted on a fault: this runs on every device access
    return fmt::format("cuda sim memcheck: {} thread {}", block.where(), block.describe_thread(block.running().linear));
  };
  // An in-place op declares the same bytes twice (read as an input, written
  // as the output): the access is fine if any declared buffer allows it.
  const BufferUse* refusing = nullptr;
  for (const BufferUse& buffer : launch.config->buffers) {
    const auto begin = reinterpret_cast<uintptr_t>(buffer.data);
    if (address - begin >= static_cast<uint64_t>(buffer.bytes)) continue;
    if (address + bytes > begin + buffer.bytes) {
      block.fault(fmt::format("{} {} {} bytes at byte {} of buffer `{}`, {} bytes past its end ({} bytes)", who(),
                              verb(kind), bytes, address - begin, buffer.name, address + bytes - begin - buffer.bytes,
                              buffer.bytes));
    }
    const bool allowed = kind == AccessKind::read ? buffer.access != BufferAccess::write
                                                  : buffer.access != BufferAccess::read;
    if (!allowed) {
      refusing = &buffer;
      continue;
    }
    if (kind != AccessKind::write) launch.counters.device_bytes_read += bytes;
    if (kind != AccessKind::read) launch.counters.device_bytes_written += bytes;
    return;
  }
  if (refusing != nullptr) {
    block.fault(fmt::format("{} {} buffer `{}`, which the launch declared {}", who(), verb(kind), refusing->name,
                            access_name(refusing->access)));
  }
  const void* pointer = reinterpret_cast<const void*>(address);
  if (is_live_device_range(pointer, bytes)) {
    block.fault(fmt::format("{} {} {} bytes of device memory at {}, outside every buffer the launch declared", who(),
                            verb(kind), bytes, describe_device_address(pointer, bytes)));
  }
  block.fault(fmt::format("{} {} {} bytes out of bounds: {}", who(), verb(kind), bytes,
                          describe_device_address(pointer, bytes)));
}

void check_shared_access(LaunchState& launch, SharedMemoryRacecheck& racecheck, const char* window, int64_t offset,
                         int64_t bytes, AccessKind kind) {
  ThreadBlock& block = *launch.block;
  launch.counters.shared_bytes_accessed += bytes;
  const std::optional<Hazard> hazard = racecheck.access(offset, bytes, kind, block.accessor());
  if (!hazard) return;
  block.fault(fmt::format(
      "cuda sim racecheck: {}: {} hazard on {} shared memory at byte {}: thread {} {} it, and thread {} accessed it "
      "earlier with no __syncthreads() between them (nor a __syncwarp, within one warp)",
      block.where(), hazard->kind, window, hazard->offset, block.describe_thread(block.running().linear), verb(kind),
      block.describe_thread(hazard->other_thread)));
}

// The hardware's limits on shared memory, with a kernel's static __shared__
// bytes measured as the bytes its block touched (at most the declared size;
// ptxas checks the declared size in the nvidia build).
void check_static_shared_footprint(LaunchState& launch) {
  const int64_t static_bytes = launch.static_racecheck.touched_bytes();
  const Architecture& arch = target_architecture();
  const bool opted_in = launch.config->shared_memory_opt_in;
  const int64_t limit = opted_in ? arch.max_shared_bytes_per_block : arch.default_shared_bytes;
  if (static_bytes <= kMaxStaticSharedBytes && static_bytes + launch.dynamic_shared_bytes <= limit) return;
  ThreadBlock& block = *launch.block;
  if (static_bytes > kMaxStaticSharedBytes) {
    block.fault(fmt::format("cuda sim: {} uses {} bytes of static __shared__ memory, above the {} a kernel may "
                            "declare statically (more needs dynamic shared memory and opting in)",
                            block.where(), static_bytes, kMaxStaticSharedBytes));
  }
  block.fault(fmt::format("cuda sim: {} uses {} bytes of static __shared__ memory and {} dynamic, above the {} bytes a "
                          "block may have on {}{}",
                          block.where(), static_bytes, launch.dynamic_shared_bytes, limit, arch.name,
                          opted_in ? "" : " without opting in (LaunchConfig::shared_memory_opt_in)"));
}

}  // namespace

void check_access(const void* pointer, int64_t bytes, AccessKind kind) {
  LaunchState* launch = current_launch();
  if (launch == nullptr || launch->block == nullptr) return;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (is_device_address(pointer)) {
    check_device_access(*launch, address, bytes, kind);
  } else if (launch->dynamic_shared.contains(address)) {
    const int64_t offset = static_cast<int64_t>(address - launch->dynamic_shared.begin);
    if (offset + bytes > launch->dynamic_shared_bytes) {
      ThreadBlock& block = *launch->block;
      block.fault(fmt::format("cuda sim memcheck: {} thread {} {} {} bytes at byte {} of dynamic shared memory, past "
                              "the {} bytes the launch configured",
                              block.where(), block.describe_thread(block.running().linear), verb(kind), bytes, offset,
                              launch->dynamic_shared_bytes));
    }
    check_shared_access(*launch, launch->dynamic_racecheck, "dynamic", offset, bytes, kind);
  } else if (launch->static_shared.contains(address)) {
    check_shared_access(*launch, launch->static_racecheck, "static",
                        static_cast<int64_t>(address - launch->static_shared.begin), bytes, kind);
    check_static_shared_footprint(*launch);
  }
}

}  // namespace tessera::cuda::sim
