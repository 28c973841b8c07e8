// Storage, the CPU allocator (aligned heap) and the statistics every device keeps.
#include "tensor/storage.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "tensor/error.h"

namespace tessera {

namespace {

constexpr size_t kCpuAlignment = 64;  // one cache line; AVX-512 loads stay aligned
// Blocks this large are aligned to a huge page and marked for transparent huge
// pages: first-touching a fresh 150 MB output (GPT-2's logits and tied-embedding
// gradient) then costs ~75 page faults instead of ~37,000, which otherwise
// dominates the time of the GEMM that fills it.
constexpr size_t kHugePage = size_t{2} << 20;

void* allocate_cpu_bytes(size_t bytes) {
  if (bytes >= kHugePage) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* data = std::aligned_alloc(kHugePage, rounded);
    if (data != nullptr) madvise(data, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
    return data;
  }
  const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  return std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
}

MemoryCounters& device_counters(Device device) {
  static MemoryCounters counters[kNumDeviceTypes];
  return counters[static_cast<int>(device.type)];
}

thread_local std::shared_ptr<MemoryCounters> current_scope;

}  // namespace

void MemoryCounters::on_allocate(int64_t bytes) {
  int64_t live = live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_bytes_.load(std::memory_order_relaxed);
  while (live > peak && !peak_bytes_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  allocation_count_.fetch_add(1, std::memory_order_relaxed);
  live_allocations_.fetch_add(1, std::memory_order_relaxed);
}

void MemoryCounters::on_free(int64_t bytes) {
  live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  live_allocations_.fetch_sub(1, std::memory_order_relaxed);
}

MemoryStats MemoryCounters::snapshot() const {
  return MemoryStats{live_bytes_.load(std::memory_order_relaxed), peak_bytes_.load(std::memory_order_relaxed),
                     allocation_count_.load(std::memory_order_relaxed),
                     live_allocations_.load(std::memory_order_relaxed)};
}

void MemoryCounters::reset_peak() { peak_bytes_.store(live_bytes_.load(std::memory_order_relaxed)); }

Storage::Storage(void* data, int64_t bytes, Device device, std::shared_ptr<MemoryCounters> scope)
    : data_(data), bytes_(bytes), device_(device), scope_(std::move(scope)) {
  device_counters(device_).on_allocate(bytes_);
  if (scope_) scope_->on_allocate(bytes_);
}

Storage::~Storage() {
  if (device_.is_cpu()) std::free(data_);
  device_counters(device_).on_free(bytes_);
  if (scope_) scope_->on_free(bytes_);
}

std::shared_ptr<Storage> allocate(Device device, int64_t bytes) {
  TESSERA_CHECK(bytes >= 0, "allocate: negative size {} bytes", bytes);
  switch (device.type) {
    case DeviceType::meta:
      return std::make_shared<Storage>(nullptr, 0, device, nullptr);
    case DeviceType::cpu: {
      void* data = allocate_cpu_bytes(static_cast<size_t>(bytes));
      TESSERA_CHECK(data != nullptr, "allocate: out of memory on cpu asking for {} bytes", bytes);
      return std::make_shared<Storage>(data, bytes, device, current_scope);
    }
    case DeviceType::cuda:
      break;
  }
  fail("allocate: no allocator for device {} in this build (CUDA support is not compiled in)", device.str());
}

MemoryStats memory_stats(Device device) { return device_counters(device).snapshot(); }

void reset_peak_memory(Device device) { device_counters(device).reset_peak(); }

MemoryScope::MemoryScope(std::shared_ptr<MemoryCounters> counters) : previous_(std::move(current_scope)) {
  current_scope = std::move(counters);
}

MemoryScope::~MemoryScope() { current_scope = std::move(previous_); }

}  // namespace tessera
