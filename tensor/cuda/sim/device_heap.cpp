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
constexpr int kSlices = kMaxDevices + 1;  // the devices, then mapped host memory
constexpr int64_t kSliceBytes = kReservedBytes / kSlices / (int64_t{1} << 30) * (int64_t{1} << 30);
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

// Each device's memory is its slice of the reservation, so an address says
// its device. First-fit over a device's free ranges, every allocation
// starting on a page. Allocations are the few, large segments of the caching
// allocator, so a map is enough.
class DeviceHeap {
 public:
  DeviceHeap() {
    begin_ = reserve("device memory");
    shadow_begin_ = reserve("initcheck's shadow of device memory");
    for (int slice = 0; slice < kSlices; ++slice) {
      devices_[slice].free[begin_ + static_cast<uintptr_t>(slice * kSliceBytes)] = kSliceBytes;
    }
    device_range_begin.store(begin_);
  }

  // The shadow byte of device `address`: the same offset in the shadow reservation.
  unsigned char* shadow_of(uintptr_t address) const {
    return reinterpret_cast<unsigned char*>(shadow_begin_ + (address - begin_));
  }

  // `slice`: a device, or kMappedHostSlice.
  void* allocate(int slice, int64_t bytes) {
    TESSERA_CHECK(bytes >= 0, "cuda sim: device_malloc of {} bytes", bytes);
    const int device = slice;
    const int64_t mapped = round_up(std::max<int64_t>(bytes, 1), page_size());
    std::lock_guard lock(mutex_);
    DeviceMemory& memory = devices_[device];
    if (memory.in_use + mapped > memory.capacity) return nullptr;
    for (auto it = memory.free.begin(); it != memory.free.end(); ++it) {
      if (it->second < mapped) continue;
      const uintptr_t address = it->first;
      const int64_t remaining = it->second - mapped;
      memory.free.erase(it);
      if (remaining > 0) memory.free[address + mapped] = remaining;
      TESSERA_CHECK(mprotect(reinterpret_cast<void*>(address), mapped, PROT_READ | PROT_WRITE) == 0 &&
                        mprotect(shadow_of(address), mapped, PROT_READ | PROT_WRITE) == 0,
                    "cuda sim: cannot map {} bytes of device memory", mapped);
      live_[address] = Allocation{bytes, mapped};
      freed_.erase(freed_.lower_bound(address), freed_.lower_bound(address + mapped));
      memory.in_use += mapped;
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
    DeviceMemory& memory = devices_[device_of(address)];
    memory.in_use -= mapped;
    insert_free(memory.free, address, mapped);
  }

  bool contains(uintptr_t address) const { return address - begin_ < static_cast<uintptr_t>(kReservedBytes); }
  int device_of(uintptr_t address) const {
    if (!contains(address)) return -1;
    return std::min(kSlices - 1, static_cast<int>((address - begin_) / static_cast<uintptr_t>(kSliceBytes)));
  }

  bool is_live(uintptr_t address, int64_t bytes) {
    std::lock_guard lock(mutex_);
    const auto it = containing(live_, address);
    return it != live_.end() && address + bytes <= it->first + it->second.requested;
  }

  std::string describe(uintptr_t address, int64_t bytes) {
    std::lock_guard lock(mutex_);
    return describe_locked(address, bytes);
  }

  int64_t capacity(int device) {
    check_device(device);
    std::lock_guard lock(mutex_);
    return devices_[device].capacity;
  }
  void set_capacity(int device, int64_t bytes) {
    check_device(device);
    std::lock_guard lock(mutex_);
    DeviceMemory& memory = devices_[device];
    TESSERA_CHECK(bytes >= memory.in_use && bytes <= kSliceBytes,
                  "cuda sim: cuda:{}'s capacity of {} bytes is below the {} in use or above the {} reserved for it",
                  device, bytes, memory.in_use, kSliceBytes);
    memory.capacity = bytes;
  }
  int64_t in_use(int device) {
    check_device(device);
    std::lock_guard lock(mutex_);
    return devices_[device].in_use;
  }

  static void check_device(int device) {
    TESSERA_CHECK(device >= 0 && device < kMaxDevices, "cuda sim: there is no cuda:{}; the simulator has cuda:0 to cuda:{}",
                  device, kMaxDevices - 1);
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
    const std::string where = place_name(device_of(address));
    if (const auto it = containing(live_, address); it != live_.end()) {
      const uintptr_t end = it->first + it->second.requested;
      if (address + bytes <= end) return fmt::format("0x{:x}, inside the {}-byte allocation at 0x{:x} {}",
                                                     address, it->second.requested, it->first, where);
      return fmt::format("0x{:x} ({} bytes), {} bytes past the end of the {}-byte allocation at 0x{:x} {}",
                         address, bytes, address + bytes - end, it->second.requested, it->first, where);
    }
    if (const auto it = containing(freed_, address); it != freed_.end()) {
      return fmt::format("0x{:x}, inside the freed {}-byte allocation at 0x{:x} {}", address,
                         it->second.requested, it->first, where);
    }
    return fmt::format("0x{:x}, outside every allocation {}", address, where);
  }

  static std::string place_name(int slice) {
    return slice == kMappedHostSlice ? "in mapped host memory" : fmt::format("on cuda:{}", slice);
  }

  static void insert_free(std::map<uintptr_t, int64_t>& free, uintptr_t address, int64_t bytes) {
    auto next = free.lower_bound(address);
    if (next != free.end() && address + bytes == next->first) {
      bytes += next->second;
      next = free.erase(next);
    }
    if (next != free.begin()) {
      const auto previous = std::prev(next);
      if (previous->first + previous->second == address) {
        previous->second += bytes;
        return;
      }
    }
    free[address] = bytes;
  }

  static uintptr_t reserve(const char* what) {
    void* base = mmap(nullptr, kReservedBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TESSERA_CHECK(base != MAP_FAILED, "cuda sim: cannot reserve {} bytes of address space for {}", kReservedBytes,
                  what);
    return reinterpret_cast<uintptr_t>(base);
  }

  struct DeviceMemory {
    int64_t capacity = kDefaultCapacity;
    int64_t in_use = 0;
    std::map<uintptr_t, int64_t> free;  // start -> bytes, inside the device's slice
  };

  std::mutex mutex_;
  uintptr_t begin_ = 0;
  uintptr_t shadow_begin_ = 0;
  DeviceMemory devices_[kSlices];
  std::map<uintptr_t, Allocation> live_;       // start -> extent
  std::map<uintptr_t, Allocation> freed_;      // the last allocation freed at each start, for messages
};

DeviceHeap& heap() {
  static DeviceHeap* instance = new DeviceHeap;  // never destroyed: kernels may run during exit
  return *instance;
}

}  // namespace

void* device_malloc(int device, int64_t bytes) {
  DeviceHeap::check_device(device);
  return heap().allocate(device, bytes);
}
void* mapped_malloc(int64_t bytes) { return heap().allocate(kMappedHostSlice, bytes); }
void device_free(void* pointer) { heap().release(pointer); }
int64_t device_capacity(int device) { return heap().capacity(device); }
void set_device_capacity(int device, int64_t bytes) { heap().set_capacity(device, bytes); }
int64_t device_bytes_in_use(int device) { return heap().in_use(device); }
int device_of_address(const void* address) { return heap().device_of(reinterpret_cast<uintptr_t>(address)); }

bool is_live_device_range(const void* address, int64_t bytes) {
  return heap().is_live(reinterpret_cast<uintptr_t>(address), bytes);
}
std::string describe_device_address(const void* address, int64_t bytes) {
  return heap().describe(reinterpret_cast<uintptr_t>(address), bytes);
}

void check_device_buffers(const std::string& operation, int device, const std::vector<BufferUse>& buffers) {
  for (const BufferUse& buffer : buffers) {
    if (buffer.bytes == 0) continue;
    TESSERA_CHECK(buffer.bytes > 0 && is_live_device_range(buffer.data, buffer.bytes),
                  "cuda sim: {}: buffer `{}` ({} bytes at {}) is not live device memory: {}", operation, buffer.name,
                  buffer.bytes, buffer.data, describe_device_address(buffer.data, buffer.bytes));
    const int owner = device_of_address(buffer.data);
    TESSERA_CHECK(owner == device || owner == kMappedHostSlice,
                  "cuda sim: {} on cuda:{}: buffer `{}` ({} bytes at {}) is cuda:{}'s memory; a device uses its own "
                  "(copy through the host, or let a collective move it: peer access is not modelled)",
                  operation, device, buffer.name, buffer.bytes, buffer.data, owner);
  }
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
