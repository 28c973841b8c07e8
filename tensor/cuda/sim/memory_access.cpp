#include "tensor/cuda/sim/memory_access.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "tensor/cuda/sim/architecture.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/launch_state.h"
#include "tensor/cuda/sim/thread_block.h"
#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

std::atomic<bool> strict_mode{[] {
  const char* value = std::getenv("TESSERA_SIM_STRICT_RACECHECK");
  return value != nullptr && std::strcmp(value, "1") == 0;
}()};

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

// "kernel `k` block (0,0,0) thread (3,0,0) at file.cu:12"
std::string who(const ThreadBlock& block, const CodeSite& site) {
  return fmt::format("{} thread {} at {}", block.where(), block.describe_thread(block.running_linear()),
                     describe(site));
}

// Whether [address, address + bytes) lies on elements of `buffer`'s view:
// each element the access touches must be one of it.
bool on_view_elements(const BufferUse& buffer, uintptr_t address, int64_t bytes) {
  const StridedElements& view = buffer.elements;
  if (view.element_bytes == 0) return true;
  const int64_t offset = static_cast<int64_t>(address - reinterpret_cast<uintptr_t>(buffer.data));
  for (int64_t element = offset / view.element_bytes; element * view.element_bytes < offset + bytes; ++element) {
    if (!view.contains(element)) return false;
  }
  return true;
}

void check_device_access(LaunchState& launch, uintptr_t address, int64_t bytes, AccessKind kind,
                         const CodeSite& site) {
  ThreadBlock& block = *launch.block;
  // An in-place op declares the same bytes twice (read as an input, written
  // as the output), and views of one tensor share a span: the access is
  // fine if any declared buffer allows it.
  const BufferUse* refusing = nullptr;
  const BufferUse* spanning = nullptr;  // a view whose span, not elements, holds the access
  for (const BufferUse& buffer : launch.config->buffers) {
    const auto begin = reinterpret_cast<uintptr_t>(buffer.data);
    if (address - begin >= static_cast<uint64_t>(buffer.bytes)) continue;
    if (address + bytes > begin + buffer.bytes) {
      block.fault(fmt::format("cuda sim memcheck: {} {} {} bytes at byte {} of buffer `{}`, {} bytes past its end ({} "
                              "bytes)",
                              who(block, site), verb(kind), bytes, address - begin, buffer.name,
                              address + bytes - begin - buffer.bytes, buffer.bytes));
    }
    if (!on_view_elements(buffer, address, bytes)) {
      spanning = &buffer;
      continue;
    }
    const bool allowed = kind == AccessKind::read ? buffer.access != BufferAccess::write
                                                  : buffer.access != BufferAccess::read;
    if (!allowed) {
      refusing = &buffer;
      continue;
    }
    const void* pointer = reinterpret_cast<const void*>(address);
    if (kind != AccessKind::write) {
      launch.counters.device_bytes_read += bytes;
      const int64_t unwritten = first_unwritten_device_byte(pointer, bytes);
      if (unwritten >= 0) {
        launch.reports.add("initcheck", site, [&] {
          return fmt::format("cuda sim initcheck: {} {} {} bytes at byte {} of buffer `{}`; byte {} was never written "
                             "since it was allocated (uninitialised device memory)",
                             who(block, site), verb(kind), bytes, address - begin, buffer.name,
                             address - begin + unwritten);
        });
      }
    }
    if (kind != AccessKind::read) {
      launch.counters.device_bytes_written += bytes;
      mark_device_written(pointer, bytes);
    }
    return;
  }
  if (refusing != nullptr) {
    block.fault(fmt::format("cuda sim memcheck: {} {} buffer `{}`, which the launch declared {}", who(block, site),
                            verb(kind), refusing->name, access_name(refusing->access)));
  }
  if (spanning != nullptr) {
    const auto begin = reinterpret_cast<uintptr_t>(spanning->data);
    block.fault(fmt::format("cuda sim memcheck: {} {} {} bytes at byte {} of buffer `{}`: inside the span of the "
                            "strided view but not on one of its elements (element {} is outside the view)",
                            who(block, site), verb(kind), bytes, address - begin, spanning->name,
                            (address - begin) / spanning->elements.element_bytes));
  }
  const void* pointer = reinterpret_cast<const void*>(address);
  if (is_live_device_range(pointer, bytes)) {
    block.fault(fmt::format("cuda sim memcheck: {} {} {} bytes of device memory at {}, outside every buffer the "
                            "launch declared",
                            who(block, site), verb(kind), bytes, describe_device_address(pointer, bytes)));
  }
  block.fault(fmt::format("cuda sim memcheck: {} {} {} bytes out of bounds: {}", who(block, site), verb(kind), bytes,
                          describe_device_address(pointer, bytes)));
}

// The running thread's access at `site` races with `hazard`'s earlier one.
std::string hazard_report(const ThreadBlock& block, const Hazard& hazard, const char* window, AccessKind kind,
                          const CodeSite& site) {
  return fmt::format(
      "cuda sim racecheck: {}: {} hazard on {} shared memory at byte {}: thread {} at {} {} it, and thread {} "
      "accessed it earlier at {} with no __syncthreads() between them (nor, within one warp, a __syncwarp whose "
      "mask holds both lanes)",
      block.where(), hazard.kind, window, hazard.offset, block.describe_thread(block.running_linear()), describe(site),
      verb(kind), block.describe_thread(hazard.other_thread), describe(hazard.other_site));
}

void check_shared_access(LaunchState& launch, SharedMemoryRacecheck& racecheck, unsigned char* window_base,
                         const char* window, int64_t offset, int64_t bytes, AccessKind kind, const CodeSite& site) {
  ThreadBlock& block = *launch.block;
  launch.counters.shared_bytes_accessed += bytes;
  const SharedAccessResult result = racecheck.access(offset, bytes, kind, block.accessor(site));
  if (result.first_unwritten >= 0) {
    launch.reports.add("initcheck", site, [&] {
      return fmt::format("cuda sim initcheck: {} {} {} bytes at byte {} of {} shared memory; byte {} was not written "
                         "by any thread of this block (uninitialised shared memory: each block starts with garbage)",
                         who(block, site), verb(kind), bytes, offset, window, result.first_unwritten);
    });
  }
  if (!result.hazard) return;
  const Hazard& hazard = *result.hazard;
  const bool maybe_same_value = kind == AccessKind::write && std::strcmp(hazard.kind, "write-after-write") == 0 &&
                                bytes <= static_cast<int64_t>(sizeof(PendingWrite::before));
  if (!maybe_same_value) {
    launch.reports.add("racecheck", site, [&] { return hazard_report(block, hazard, window, kind, site); });
    return;
  }
  PendingWrite& pending = launch.pending_write;
  pending.pending = true;
  pending.bytes = window_base + offset;
  pending.count = bytes;
  std::memcpy(pending.before, pending.bytes, static_cast<size_t>(bytes));
  pending.site = site;
  pending.hazard = hazard;
  pending.window = window;
}

// The hardware's limits on shared memory, with a kernel's static __shared__
// bytes measured as the bytes its block touched (at most the declared size;
// ptxas checks the declared size in the nvidia build).
void check_static_shared_footprint(LaunchState& launch) {
  const int64_t static_bytes = launch.static_racecheck->touched_bytes();
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

void check_alignment(ThreadBlock& block, uintptr_t address, int64_t bytes, AccessKind kind, const char* space,
                     const CodeSite& site) {
  if (address % static_cast<uint64_t>(bytes) == 0) return;
  block.fault(fmt::format("cuda sim memcheck: {} {} {} bytes of {} memory at an address that is not a multiple of {} "
                          "(misaligned address: the GPU requires a {}-byte access, such as a float4 or "
                          "__nv_bfloat162 load, to be {}-byte aligned)",
                          who(block, site), verb(kind), bytes, space, bytes, bytes, bytes));
}

}  // namespace

bool strict_racecheck() { return strict_mode.load(); }
void set_strict_racecheck(bool strict) { strict_mode.store(strict); }

void check_typed_alignment(const void* address, int64_t alignment, const char* type, int check_kind,
                           const char* file, uint32_t line) {
  LaunchState* launch = current_launch();
  if (launch == nullptr || launch->block == nullptr) return;  // host code: its own sanitizers' business
  const char* what = check_kind == 0 ? "load of" : check_kind == 1 ? "store to" : "access within";
  ThreadBlock& block = *launch->block;
  const std::string site = fmt::format("{}:{}", relative_source_path(file), line);
  block.fault(fmt::format("cuda sim memcheck: {} thread {} at {}: {} {} at {}, which is not a multiple of {} "
                          "(misaligned address: the GPU requires a {}-byte aligned address for {})",
                          block.where(), block.describe_thread(block.running_linear()), site, what, type, address,
                          alignment, alignment, type));
}

void memory_poll(const CodeSite& site, bool stored) {
  LaunchState* launch = current_launch();
  if (launch == nullptr || launch->block == nullptr) return;
  if (stored) launch->block->note_progress();
  launch->block->spin_point(site);
}

void settle_pending_write() {
  LaunchState* launch = current_launch();
  if (launch == nullptr || !launch->pending_write.pending) return;
  PendingWrite& pending = launch->pending_write;
  pending.pending = false;
  const auto report = [&] {
    return hazard_report(*launch->block, pending.hazard, pending.window, AccessKind::write, pending.site);
  };
  if (std::memcmp(pending.before, pending.bytes, static_cast<size_t>(pending.count)) != 0) {
    launch->reports.add("racecheck", pending.site, report);
  } else if (strict_racecheck()) {
    launch->reports.add("racecheck (strict)", pending.site, [&] {
      return report() + "; it stored the value already there (a same-value write: benign on the hardware, "
                        "reported because strict racecheck is on)";
    });
  }
}

void check_access(const void* pointer, int64_t bytes, AccessKind kind, const CodeSite& site, bool naturally_aligned) {
  // Without the hooks (the AddressSanitizer build) only atomics would get
  // here: checking them alone would see reads of bytes whose stores it missed.
  if constexpr (TESSERA_SIM_CHECKS == 0) return;
  LaunchState* launch = current_launch();
  if (launch == nullptr || launch->block == nullptr) return;
  if (launch->pending_write.pending) settle_pending_write();
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  ThreadBlock& block = *launch->block;
  const bool device = is_device_address(pointer), dynamic = !device && launch->dynamic_shared.contains(address);
  if (!device && !dynamic && !launch->static_shared.contains(address)) {
    return;  // the thread's own stack, or host memory of a .cu file's host code
  }
  if (kind == AccessKind::write) block.note_progress();
  if (naturally_aligned) check_alignment(block, address, bytes, kind, device ? "device" : "shared", site);
  if (device) {
    check_device_access(*launch, address, bytes, kind, site);
  } else if (dynamic) {
    const int64_t offset = static_cast<int64_t>(address - launch->dynamic_shared.begin);
    if (offset + bytes > launch->dynamic_shared_bytes) {
      block.fault(fmt::format("cuda sim memcheck: {} {} {} bytes at byte {} of dynamic shared memory, past the {} "
                              "bytes the launch configured",
                              who(block, site), verb(kind), bytes, offset, launch->dynamic_shared_bytes));
    }
    check_shared_access(*launch, *launch->dynamic_racecheck,
                        reinterpret_cast<unsigned char*>(launch->dynamic_shared.begin), "dynamic", offset, bytes, kind,
                        site);
  } else {
    check_shared_access(*launch, *launch->static_racecheck,
                        reinterpret_cast<unsigned char*>(launch->static_shared.begin), "static",
                        static_cast<int64_t>(address - launch->static_shared.begin), bytes, kind, site);
    check_static_shared_footprint(*launch);
  }
}

std::string LaunchReports::text() const {
  std::string text;
  for (const Message& message : messages_) {
    const int64_t count = counts_.at(message.key);
    if (!text.empty()) text += "\n";
    text += message.text;
    if (count > 1) text += fmt::format(" [and {} more times at this site]", count - 1);
  }
  return text;
}

}  // namespace tessera::cuda::sim
