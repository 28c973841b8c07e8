// Storage, device dispatch of allocation, and the statistics every device
// keeps. Cpu bytes come from the host's allocator; a device's from its
// runtime (tensor/device_runtime.h).
#include "tensor/storage.h"

#include "tensor/cpu/allocator.h"
#include "tensor/device_runtime.h"
#include "tensor/error.h"

namespace tessera {

namespace {

// One set per cpu and meta, and per cuda device: each rank's GPU is its own.
constexpr int kCountedCudaDevices = 16;

MemoryCounters& device_counters(Device device) {
  static MemoryCounters counters[kNumDeviceTypes];
  static MemoryCounters cuda_counters[kCountedCudaDevices];
  if (!device.is_cuda()) return counters[static_cast<int>(device.type)];
  TESSERA_CHECK(device.index >= 0 && device.index < kCountedCudaDevices,
                "memory statistics: {} is beyond the {} cuda devices tessera counts", device.str(),
                kCountedCudaDevices);
  return cuda_counters[device.index];
}

thread_local std::shared_ptr<MemoryCounters> current_scope;

// Bytes for a new storage on cpu or cuda (meta has none). The device's
// runtime throws its own out-of-memory error, with its statistics.
void* allocate_data(Device device, int64_t bytes, const char* what) {
  if (!device.is_cpu()) return device_runtime(device).allocate(device, bytes, what);
  void* data = cpu::allocate_bytes(static_cast<size_t>(bytes));
  TESSERA_CHECK(data != nullptr, "{}: out of memory on {} asking for {} bytes", what, device.str(), bytes);
  return data;
}

}  // namespace

void MemoryCounters::on_allocate(int64_t bytes) {
  int64_t live = live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_bytes_.load(std::memory_order_relaxed);
  while (live > peak && !peak_bytes_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  allocation_count_.fetch_add(1, std::memory_order_relaxed);
  live_allocations_.fetch_add(1, std::memory_order_relaxed);
  if (parent_) parent_->on_allocate(bytes);
}

void MemoryCounters::on_free(int64_t bytes) {
  live_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  live_allocations_.fetch_sub(1, std::memory_order_relaxed);
  if (parent_) parent_->on_free(bytes);
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

Storage::Storage(Device device, int64_t bytes) : data_(nullptr), bytes_(bytes), device_(device), released_(true) {}

std::shared_ptr<Storage> Storage::released(Device device, int64_t bytes) {
  TESSERA_CHECK(bytes >= 0, "Storage::released: negative size {} bytes", bytes);
  if (device.is_meta()) return allocate(device, bytes);
  return std::shared_ptr<Storage>(new Storage(device, bytes));
}

std::shared_ptr<Storage> Storage::adopt_host(void* data, int64_t bytes, void (*free_bytes)(void*)) {
  TESSERA_CHECK(bytes >= 0 && free_bytes != nullptr, "Storage::adopt_host: {} bytes, {} free function", bytes,
                free_bytes != nullptr ? "a" : "no");
  auto storage = std::make_shared<Storage>(data, bytes, kCPU, current_scope);
  storage->adopted_free_ = free_bytes;
  return storage;
}

Storage::~Storage() {
  if (!released_) free_data();
}

void Storage::free_data() {
  if (adopted_free_ != nullptr) {
    adopted_free_(data_);
    adopted_free_ = nullptr;  // restore_data allocates ordinary memory
  } else if (device_.is_cpu()) {
    cpu::free_bytes(data_, static_cast<size_t>(bytes_));
  } else if (device_.is_cuda()) {
    device_runtime(device_).free(device_, data_);
  }
  device_counters(device_).on_free(bytes_);
  if (scope_) scope_->on_free(bytes_);
}

void Storage::release_data() {
  if (released_ || device_.is_meta()) return;
  free_data();
  data_ = nullptr;
  released_ = true;
}

void Storage::restore_data() {
  if (!released_) return;
  data_ = allocate_data(device_, bytes_, "Storage::restore_data");
  scope_ = current_scope;
  released_ = false;
  device_counters(device_).on_allocate(bytes_);
  if (scope_) scope_->on_allocate(bytes_);
}

std::shared_ptr<Storage> allocate(Device device, int64_t bytes) {
  TESSERA_CHECK(bytes >= 0, "allocate: negative size {} bytes", bytes);
  switch (device.type) {
    case DeviceType::meta:
      return std::make_shared<Storage>(nullptr, 0, device, nullptr);
    case DeviceType::cpu:
    case DeviceType::cuda:
      return std::make_shared<Storage>(allocate_data(device, bytes, "allocate"), bytes, device, current_scope);
  }
  fail("allocate: unknown device {}", device.str());
}

MemoryStats memory_stats(Device device) {
  MemoryStats stats = device_counters(device).snapshot();
  if (device.is_cpu()) stats.cached_bytes = cpu::cached_bytes();
  if (device.is_cuda()) stats.cached_bytes = device_runtime(device).cached_bytes(device);
  return stats;
}

void release_cached_memory(Device device) {
  if (device.is_cpu()) cpu::release_cached_blocks();
  if (device.is_cuda()) device_runtime(device).release_cached_memory(device);
}

void reset_peak_memory(Device device) { device_counters(device).reset_peak(); }

void record_stream(const Storage& storage, const std::shared_ptr<Stream>& stream) {
  if (storage.device().is_cuda() && storage.data() != nullptr) {
    device_runtime(storage.device()).record_stream(storage.device(), storage.data(), stream);
  }
}

const std::shared_ptr<MemoryCounters>& MemoryScope::current() { return current_scope; }

MemoryScope::MemoryScope(std::shared_ptr<MemoryCounters> counters) : previous_(std::move(current_scope)) {
  current_scope = std::move(counters);
}

MemoryScope::~MemoryScope() { current_scope = std::move(previous_); }

}  // namespace tessera
