#include "tensor/cuda/sim/device_heap.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "tensor/cuda/sim/stream_order_checker.h"
#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

constexpr int64_t kAlignment = 256;
constexpr int64_t kReservedBytes = kDeviceRangeBytes;  // address space only (PROT_NONE)
constexpr int64_t kDefaultCapacity = int64_t{16} << 30;

int64_t page_size() {
  static const int64_t size = sysconf(_SC_PAGESIZE);
  return size;
}
int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

struct Allocation {
  int64_t requested;  // what the caller asked for: accesses beyond it are out of bounds
  int64_t mapped;     // page-rounded extent
};

// First-fit over free ranges of the reservation, every allocation starting on
// a page. Allocations are the few, large segments of the caching allocator,
// so a map is enough.
class DeviceHeap {
 public:
  DeviceHeap() {
    begin_ = reserve("device memory");
    shadow_begin_ = reserve("initcheck's shadow of device memory");
    free_[begin_] = kReservedBytes;
    device_range_begin.store(begin_);
  }

  // The shadow byte of device `address`: the same offset in the shadow reservation.
  unsigned char* shadow_of(uintptr_t address) const {
    return reinterpret_cast<unsigned char*>(shadow_begin_ + (address - begin_));
  }

  void* allocate(int64_t bytes) {
    TESSERA_CHECK(bytes >= 0, "cuda sim: device_malloc of {} bytes", bytes);
    const int64_t mapped = round_up(std::max<int64_t>(bytes, 1), page_size());
    std::lock_guard lock(mutex_);
    if (in_use_ + mapped > capacity_) return nullptr;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < mapped) continue;
      const uintptr_t address = it->first;
      const int64_t remaining = it->second - mapped;
      free_.erase(it);
      if (remaining > 0) free_[address + mapped] = remaining;
      TESSERA_CHECK(mprotect(reinterpret_cast<void*>(address), mapped, PROT_READ | PROT_WRITE) == 0 &&
                        mprotect(shadow_of(address), mapped, PROT_READ | PROT_WRITE) == 0,
                    "cuda sim: cannot map {} bytes of device memory", mapped);
      live_[address] = Allocation{bytes, mapped};
      freed_.erase(freed_.lower_bound(address), freed_.lower_bound(address + mapped));
      in_use_ += mapped;
      return reinterpret_cast<void*>(address);
    }
    return nullptr;
  }

  void release(void* pointer) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    std::lock_guard lock(mutex_);
    const auto it = live_.find(address);
    TESSERA_CHECK(it != live_.end(), "cuda sim: device_free({}) of {}", pointer, describe_locked(address, 1));
    const int64_t mapped = it->second.mapped;
    StreamOrderChecker::instance().forget(pointer, mapped);
    for (void* range : {pointer, static_cast<void*>(shadow_of(address))}) {
      madvise(range, mapped, MADV_DONTNEED);  // the next allocation here starts zeroed and unwritten
      mprotect(range, mapped, PROT_NONE);
    }
    freed_[address] = it->second;
    live_.erase(it);
    in_use_ -= mapped;
    insert_free(address, mapped);
  }

  bool contains(uintptr_t address) const { return address - begin_ < static_cast<uintptr_t>(kReservedBytes); }

  bool is_live(uintptr_t address, int64_t bytes) {
    std::lock_guard lock(mutex_);
    const auto it = containing(live_, address);
    return it != live_.end() && address + bytes <= it->first + it->second.requested;
  }

  std::string describe(uintptr_t address, int64_t bytes) {
    std::lock_guard lock(mutex_);
    return describe_locked(address, bytes);
  }

  int64_t capacity() {
    std::lock_guard lock(mutex_);
    return capacity_;
  }
  void set_capacity(int64_t bytes) {
    std::lock_guard lock(mutex_);
    TESSERA_CHECK(bytes >= in_use_ && bytes <= kReservedBytes,
                  "cuda sim: device capacity {} bytes is below the {} in use or above the {} reserved", bytes, in_use_,
                  kReservedBytes);
    capacity_ = bytes;
  }
  int64_t in_use() {
    std::lock_guard lock(mutex_);
    return in_use_;
  }

 private:
  // The allocation starting at or below `address`, if `address` is inside its mapped extent.
  static std::map<uintptr_t, Allocation>::const_iterator containing(const std::map<uintptr_t, Allocation>& allocations,
                                                                    uintptr_t address) {
    auto it = allocations.upper_bound(address);
    if (it == allocations.begin()) return allocations.end();
    --it;
    return address < it->first + static_cast<uintptr_t>(it->second.mapped) ? it : allocations.end();
  }

  std::string describe_locked(uintptr_t address, int64_t bytes) const {
    if (!contains(address)) return fmt::format("0x{:x}, which is not device memory", address);
    if (const auto it = containing(live_, address); it != live_.end()) {
      const uintptr_t end = it->first + it->second.requested;
      if (address + bytes <= end) return fmt::format("0x{:x}, inside the {}-byte allocation at 0x{:x}", address,
                                                     it->second.requested, it->first);
      return fmt::format("0x{:x} ({} bytes), {} bytes past the end of the {}-byte allocation at 0x{:x}", address,
                         bytes, address + bytes - end, it->second.requested, it->first);
    }
    if (const auto it = containing(freed_, address); it != freed_.end()) {
      return fmt::format("0x{:x}, inside the freed {}-byte allocation at 0x{:x}", address, it->second.requested,
                         it->first);
    }
    return fmt::format("0x{:x}, outside every device allocation", address);
  }

  void insert_free(uintptr_t address, int64_t bytes) {
    auto next = free_.lower_bound(address);
    if (next != free_.end() && address + bytes == next->first) {
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      const auto previous = std::prev(next);
      if (previous->first + previous->second == address) {
        previous->second += bytes;
        return;
      }
    }
    free_[address] = bytes;
  }

  static uintptr_t reserve(const char* what) {
    void* base = mmap(nullptr, kReservedBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TESSERA_CHECK(base != MAP_FAILED, "cuda sim: cannot reserve {} bytes of address space for {}", kReservedBytes,
                  what);
    return reinterpret_cast<uintptr_t>(base);
  }

  std::mutex mutex_;
  uintptr_t begin_ = 0;
  uintptr_t shadow_begin_ = 0;
  int64_t capacity_ = kDefaultCapacity;
  int64_t in_use_ = 0;
  std::map<uintptr_t, int64_t> free_;          // start -> bytes
  std::map<uintptr_t, Allocation> live_;       // start -> extent
  std::map<uintptr_t, Allocation> freed_;      // the last allocation freed at each start, for messages
};

DeviceHeap& heap() {
  static DeviceHeap* instance = new DeviceHeap;  // never destroyed: kernels may run during exit
  return *instance;
}

}  // namespace

void* device_malloc(int64_t bytes) { return heap().allocate(bytes); }
void device_free(void* pointer) { heap().release(pointer); }
int64_t device_capacity() { return heap().capacity(); }
void set_device_capacity(int64_t bytes) { heap().set_capacity(bytes); }
int64_t device_bytes_in_use() { return heap().in_use(); }

bool is_live_device_range(const void* address, int64_t bytes) {
  return heap().is_live(reinterpret_cast<uintptr_t>(address), bytes);
}
std::string describe_device_address(const void* address, int64_t bytes) {
  return heap().describe(reinterpret_cast<uintptr_t>(address), bytes);
}

// The shadow is only touched for live ranges (callers checked them), so its
// pages are mapped; distinct bytes are written by distinct threads only.
void mark_device_written(const void* address, int64_t bytes) {
  std::memset(heap().shadow_of(reinterpret_cast<uintptr_t>(address)), 1, static_cast<size_t>(bytes));
}

int64_t first_unwritten_device_byte(const void* address, int64_t bytes) {
  const unsigned char* shadow = heap().shadow_of(reinterpret_cast<uintptr_t>(address));
  const void* unwritten = std::memchr(shadow, 0, static_cast<size_t>(bytes));
  return unwritten == nullptr ? -1 : static_cast<const unsigned char*>(unwritten) - shadow;
}

void copy_device_written_state(void* destination, const void* source, int64_t bytes) {
  DeviceHeap& device = heap();
  std::memmove(device.shadow_of(reinterpret_cast<uintptr_t>(destination)),
               device.shadow_of(reinterpret_cast<uintptr_t>(source)), static_cast<size_t>(bytes));
}

}  // namespace tessera::cuda::sim
