// The simulator as the cuda device's runtime.
#include "tensor/cuda/runtime.h"

#include "tensor/cuda/sim/device_heap.h"

namespace tessera::cuda {

const char* runtime_name() { return "sim"; }
void* device_malloc(int64_t bytes) { return sim::device_malloc(bytes); }
void device_free(void* pointer) { sim::device_free(pointer); }

}  // namespace tessera::cuda
