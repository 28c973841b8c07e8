// The simulated GPU's memory: one reserved range of the address space, so an
// address is device memory exactly when it falls inside it, and a registry of
// live allocations, so an access that lands outside every allocation (past an
// end, or after a free) is caught and described. Unallocated pages are not
// mapped, so even a host pointer that escaped the API cannot read them.
// This is cudaMalloc/cudaFree; the caching allocator sits above it.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::cuda::sim {

// Returns nullptr when the allocation would exceed the device capacity (as
// cudaMalloc returns cudaErrorMemoryAllocation); 256-byte aligned.
void* device_malloc(int64_t bytes);
// Frees an allocation from device_malloc; anything else is an error.
void device_free(void* pointer);

// The simulated device's capacity (16 GiB unless set), so that out-of-memory
// paths can be tested. Lowering it below what is allocated is an error.
int64_t device_capacity();
void set_device_capacity(int64_t bytes);
int64_t device_bytes_in_use();

bool is_device_address(const void* address);
// Whether [address, address + bytes) lies inside one live allocation.
bool is_live_device_range(const void* address, int64_t bytes);
// "16 bytes past the end of the 4096-byte allocation at 0x...", "inside a
// freed allocation ..." or "outside every allocation": for memcheck messages.
std::string describe_device_address(const void* address, int64_t bytes);

}  // namespace tessera::cuda::sim
