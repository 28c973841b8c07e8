// What a kernel launch needs on either runtime: the grid, the block, dynamic
// shared memory, the stream, and the device buffers the kernel reads and
// writes. Declaring the buffers is what lets the simulator bound-check every
// access, count the bytes a kernel moves, and order the launch against work
// on other streams.
#pragma once

#include <vector_types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {
class Stream;
}

namespace tessera::cuda {

enum class BufferAccess : uint8_t { read, write, read_write };

// One device buffer a kernel touches: [data, data + bytes).
struct BufferUse {
  std::string name;  // for messages: "out", "x", ...
  const void* data;
  int64_t bytes;
  BufferAccess access;
};

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  int64_t dynamic_shared_bytes = 0;
  // More than 48 KiB of shared memory per block needs the kernel's opt-in
  // (cudaFuncAttributeMaxDynamicSharedMemorySize), as on the hardware.
  bool shared_memory_opt_in = false;
  std::vector<BufferUse> buffers;
  // Where the launch runs. In the simulator a null stream runs it on the
  // calling thread and throws its errors there.
  Stream* stream = nullptr;
};

}  // namespace tessera::cuda
