// What the cuda device needs from the runtime underneath it, the same calls
// for the nvidia runtime (cudaMalloc, cudaFree) and the simulator (its
// device heap). The caching allocator, the copy API and the cuda device's
// runtime table (device_runtime.cpp) are written once against these.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/device.h"

namespace tessera {
class Stream;
}

namespace tessera::cuda {

// "sim" or "nvidia": what runs the cuda device in this build.
const char* runtime_name();
// One line on what runs cuda:`index`: the GPU's name, compute capability and
// memory, or the simulator's target architecture and that it is simulated.
std::string describe_device(int index);
// Whether cuBLASLt multiplies FP8 matrices on cuda:`index`: compute
// capability 8.9 (Ada) or newer; the simulator's sm_90 and sm_100 targets.
bool has_fp8_gemm(int index);
// cudaGetDeviceCount: the GPUs this process sees (the simulator's 8).
int device_count();
// cuda:`index` is one of them; otherwise an Error naming what exists.
void check_device_index(int index);
// cudaSetDevice / cudaGetDevice, per host thread (0 until set): a rank's
// thread binds to its GPU once (dist's ranks as threads, or one process per
// GPU by its local rank).
void set_device(int index);
int current_device();

// cudaStreamCreateWithPriority on `device` (a cuda device): a non-blocking
// NvidiaStream, or a SimStream (tensor/stream.h has what streams promise).
std::shared_ptr<Stream> create_stream(Device device, int priority);

// cudaMalloc on cuda:`device`: a segment of at least `bytes`, or nullptr
// when the device is out of memory.
void* device_malloc(int device, int64_t bytes);
// cudaFree on cuda:`device` (which also waits for the device to finish with it).
void device_free(int device, void* pointer);

// Page-locked host memory for transfers (cudaHostAlloc); the simulator's is
// ordinary host memory.
void* pinned_host_malloc(int64_t bytes);
// Memory the host and the device both address by the same pointer: mapped
// page-locked host memory (cudaHostAllocMapped, unified addressing) on the
// nvidia runtime, the device heap (which is host memory) in the simulator.
// Never freed: it holds small per-stream records.
void* mapped_host_malloc(int64_t bytes);
void pinned_host_free(void* pointer);

enum class CopyKind : uint8_t { host_to_device, device_to_host, device_to_device };
// cudaMemcpyAsync on `stream`. The simulator checks the device side like a
// kernel's buffers (bounds, and the stream-ordering checker).
void memcpy_async(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream& stream);
// The host is about to read (writes: or write) `bytes` of host memory at
// `data`. The simulator's stream-ordering checker throws unless every copy
// on a stream that wrote them (or, for a write, touched them) is known to
// the host to have run (a synchronize, or an Event seen complete); the
// nvidia runtime checks nothing.
void check_host_access(const void* data, int64_t bytes, bool writes, const char* operation);

}  // namespace tessera::cuda
