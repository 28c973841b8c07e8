// What the cuda device needs from the runtime underneath it, the same calls
// for the nvidia runtime (cudaMalloc, cudaFree) and the simulator (its
// device heap). The caching allocator and the copy API are written once
// against these.
#pragma once

#include <cstdint>

namespace tessera::cuda {

// "sim" or "nvidia": what runs the cuda device in this build.
const char* runtime_name();
// cudaMalloc: a segment of at least `bytes`, or nullptr when the device is
// out of memory.
void* device_malloc(int64_t bytes);
// cudaFree (which also waits for the device to finish with it).
void device_free(void* pointer);

}  // namespace tessera::cuda
