// Storage and the per-device allocators with their statistics. Every byte a
// tensor owns comes from here, so tests and benchmarks can assert the memory a
// design promises (FSDP's "memory falls as 1/N" is checked against these).
//
// Besides the per-device totals, a thread may open a MemoryScope: allocations
// made while it is open are also charged to the scope's counters (and their
// frees credited back, on whichever thread they happen). Ranks simulated as
// threads use this to read their own memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "tensor/device.h"

namespace tessera {
class Stream;
}

namespace tessera {

struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocation_count = 0;  // allocations made since start
  int64_t live_allocations = 0;
  // Device totals only: freed bytes the allocator keeps for reuse instead of
  // returning them to the system (not part of live or peak).
  int64_t cached_bytes = 0;
};

// Lock-free counters behind MemoryStats. Counters may have a parent that is
// charged with them (FSDP's unsharded-parameter counters inside a rank's).
class MemoryCounters {
 public:
  explicit MemoryCounters(std::shared_ptr<MemoryCounters> parent = nullptr) : parent_(std::move(parent)) {}
  void on_allocate(int64_t bytes);
  void on_free(int64_t bytes);
  MemoryStats snapshot() const;
  void reset_peak();  // peak := live

 private:
  std::atomic<int64_t> live_bytes_{0};
  std::atomic<int64_t> peak_bytes_{0};
  std::atomic<int64_t> allocation_count_{0};
  std::atomic<int64_t> live_allocations_{0};
  std::shared_ptr<MemoryCounters> parent_;
};

// The bytes behind one or more tensors (views share it); frees itself (and updates the counters that were
// charged) when the last owner lets go.
class Storage {
 public:
  Storage(void* data, int64_t bytes, Device device, std::shared_ptr<MemoryCounters> scope);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // FSDP frees an unsharded parameter's bytes after use while the Storage
  // object lives on in the autograd graph (torch's storage.resize_(0)), and
  // brings them back, uninitialised, before the parameter is used again.
  // While released, bytes() keeps the nominal size and data() is null.
  bool is_released() const { return released_; }
  void release_data();
  // Allocates the bytes again, charged to the thread's current scope.
  void restore_data();
  // A storage of `bytes` that starts released: it costs nothing until restored.
  static std::shared_ptr<Storage> released(Device device, int64_t bytes);
  // Host bytes allocated elsewhere (page-locked memory from the cuda
  // runtime), counted as cpu memory and given back with `free_bytes`.
  static std::shared_ptr<Storage> adopt_host(void* data, int64_t bytes, void (*free_bytes)(void*));

 private:
  Storage(Device device, int64_t bytes);  // released from the start
  void free_data();

  void* data_;
  int64_t bytes_;
  Device device_;
  std::shared_ptr<MemoryCounters> scope_;
  bool released_ = false;
  void (*adopted_free_)(void*) = nullptr;  // set by adopt_host
};

// Allocates `bytes` on `device` (64-byte aligned on CPU); meta returns a block
// with no data. Throws tessera::Error if the device has no allocator or memory
// runs out.
std::shared_ptr<Storage> allocate(Device device, int64_t bytes);

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// Returns the allocator's cached free blocks to the system.
void release_cached_memory(Device device);
// The storage's bytes are also used by work on `stream` (a collective on a
// group's stream): a cuda block is not reused until that stream has passed
// this point (the caching allocator's record_stream). Nothing for host memory.
void record_stream(const Storage& storage, const std::shared_ptr<Stream>& stream);

// Charges allocations made on this thread to `counters` while alive. Scopes
// nest; the innermost is charged (plus its parents and the device totals).
class MemoryScope {
 public:
  // The counters charged on this thread now (null: only the device totals).
  static const std::shared_ptr<MemoryCounters>& current();

  explicit MemoryScope(std::shared_ptr<MemoryCounters> counters);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  std::shared_ptr<MemoryCounters> previous_;
};

}  // namespace tessera
