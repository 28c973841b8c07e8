// The simulated GPUs' memory: one reserved range of the address space, so an
// address is device memory exactly when it falls inside it, cut into one
// slice per device (cuda:0 to cuda:15), so an address also says its device;
// and a registry of live allocations, so an access that lands outside every
// allocation (past an end, or after a free) is caught and described.
// Unallocated pages are not mapped, so even a host pointer that escaped the
// API cannot read them. This is cudaMalloc/cudaFree; the caching allocator
// sits above it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cuda/launch_config.h"

namespace tessera::cuda::sim {

// Two nodes of eight: enough for a (dp 2, tp 8) mesh, the smallest that
// records a tp-8 layout's schedule with its FSDP collectives.
inline constexpr int kMaxDevices = 16;
// Where mapped host memory lives (mapped_malloc): a slice of its own, which
// every device may address, as pinned mapped memory is on a GPU.
inline constexpr int kMappedHostSlice = kMaxDevices;

// Memory on cuda:`device`; nullptr when the allocation would exceed the
// device's capacity (as cudaMalloc returns cudaErrorMemoryAllocation);
// 256-byte aligned. A device outside [0, kMaxDevices) is an error.
void* device_malloc(int device, int64_t bytes);
// Mapped host memory (cudaHostAllocMapped): allocated like device memory,
// so the checks see it, in a slice every device may use.
void* mapped_malloc(int64_t bytes);
// Frees an allocation from device_malloc; anything else is an error.
void device_free(void* pointer);

// A simulated device's capacity (16 GiB unless set), so that out-of-memory
// paths can be tested. Lowering it below what is allocated is an error.
int64_t device_capacity(int device);
void set_device_capacity(int device, int64_t bytes);
int64_t device_bytes_in_use(int device);
// The device whose memory `address` is, kMappedHostSlice for mapped host
// memory, or -1 for other host memory.
int device_of_address(const void* address);
// Checks each device buffer of an operation on cuda:`device` (a kernel, a
// copy, a GEMM): live device memory of that device (or mapped host memory).
// Otherwise an Error naming `operation`, the buffer and what its bytes are;
// another device's memory is named as such (peer access is not modelled).
void check_device_buffers(const std::string& operation, int device, const std::vector<BufferUse>& buffers);

// Where the reserved range starts (0 until the first allocation makes it):
// is_device_address runs on every access a kernel makes, so it is inline.
inline std::atomic<uintptr_t> device_range_begin{0};
inline constexpr uint64_t kDeviceRangeBytes = uint64_t{512} << 30;  // address space only
inline bool is_device_address(const void* address) {
  const uintptr_t begin = device_range_begin.load(std::memory_order_relaxed);
  return begin != 0 && reinterpret_cast<uintptr_t>(address) - begin < kDeviceRangeBytes;
}
// Whether [address, address + bytes) lies inside one live allocation.
bool is_live_device_range(const void* address, int64_t bytes);
// "16 bytes past the end of the 4096-byte allocation at 0x...", "inside a
// freed allocation ..." or "outside every allocation": for memcheck messages.
std::string describe_device_address(const void* address, int64_t bytes);

// Initcheck's shadow: one byte per byte of device memory saying whether it
// has been written since it was allocated. Fresh allocations are unwritten
// (the memory itself reads as zero, which would hide a missing
// initialisation); kernel stores, copies to the device and host-mapped
// records mark it. Host code that writes device memory directly (tests
// filling buffers, as cudaMemcpy would) says so with mark_device_written.
void mark_device_written(const void* address, int64_t bytes);
// The offset of the first byte of [address, address + bytes) not written
// yet, or -1 when every byte has been.
int64_t first_unwritten_device_byte(const void* address, int64_t bytes);
// A device-to-device copy carries the source's written state to the destination.
void copy_device_written_state(void* destination, const void* source, int64_t bytes);

}  // namespace tessera::cuda::sim
