// The device-runtime table: what a device's runtime does besides computing
// (memory, streams, copies between host and device), as the kernel table
// (tensor/kernels.h) is what it computes. Storage, Stream, host staging,
// describe_device and kernels() reach a device only through these two
// tables, so the generic tensor code is the same in every build and never
// names the simulator or the CUDA runtime.
//
// The seam is at link time: cuda::runtime_table() is defined by
// tensor/cuda/device_runtime.cpp in a build with a cuda runtime (sim or
// nvidia), and by tensor/no_cuda_runtime.cpp otherwise, whose entries that
// need the device raise a tessera::Error naming it and how to configure a
// build that has one. It is a call, not a registration by a static
// initializer: libtessera is linked statically, and the linker drops an
// object file that nothing references.
//
// The host needs no table: cpu memory is tensor/cpu/allocator.h's, cpu
// streams are WorkerStreams (tensor/stream.h), and meta has no bytes. A new
// device runtime adds its DeviceType, fills a DeviceRuntime and a
// KernelTable in its own folder (as tensor/cuda/ does), gives builds
// without it a file like no_cuda_runtime.cpp, and adds its case to
// device_runtime() in tensor/device_runtime.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace tessera {

struct KernelTable;

// Every entry takes the device it serves (of the table's DeviceType) where
// the call concerns one device; host staging concerns the host and the
// build's one device runtime, which it finds as cuda::runtime_table().
struct DeviceRuntime {
  // One line on what runs `device`: the GPU's name, compute capability and
  // memory, or the simulator's target and that it is simulated.
  std::string (*describe)(Device device);
  // The kernels of `device` (what kernels(device) returns).
  const KernelTable& (*kernels)(Device device);

  // Memory. Storage counts every allocation in MemoryCounters; the runtime's
  // allocator may also keep freed blocks for reuse (cached_bytes).
  // `bytes` for a tensor on `device`, usable on the allocating thread's
  // current stream; throws tessera::Error (naming `caller`, or the
  // allocator's statistics) when the device cannot give them.
  void* (*allocate)(Device device, int64_t bytes, const char* caller);
  // Gives back what allocate returned.
  void (*free)(Device device, void* data);
  // `data` (from allocate) is also used by work on `stream`: it is not
  // reused before that stream has passed this point (record_stream).
  void (*record_stream)(Device device, void* data, const std::shared_ptr<Stream>& stream);
  // Freed bytes the allocator keeps for reuse (MemoryStats::cached_bytes).
  int64_t (*cached_bytes)(Device device);
  // Returns those cached bytes to the system.
  void (*release_cached_memory)(Device device);

  // A new stream of `device` at `priority` (lower runs first). Events are
  // the records a stream makes (Stream::record_event), so they need no entry.
  std::shared_ptr<Stream> (*create_stream)(Device device, int priority);

  // Host staging (tensor/host_staging.h): page-locked host tensors, and
  // copies between them and the device enqueued on a stream.
  Tensor (*pinned_empty)(const Shape& sizes, DType dtype);
  Event (*copy_to_host_async)(const Tensor& host, const Tensor& device, Stream& stream);
  Event (*copy_from_host_async)(const Tensor& device, const Tensor& host, Stream& stream);
  // The host is about to read (writes: or write) the cpu tensor `host`; a
  // runtime that tracks copies checks that those touching it are known
  // complete (the simulator's stream-ordering checker).
  void (*check_host_access)(const Tensor& host, bool writes, const char* operation);
};

// The runtime of `device`; throws tessera::Error for cpu and meta, which the
// host serves without one.
const DeviceRuntime& device_runtime(Device device);

namespace cuda {
// tensor/cuda/device_runtime.cpp, or tensor/no_cuda_runtime.cpp in a build
// without a cuda runtime.
const DeviceRuntime& runtime_table();
}  // namespace cuda

}  // namespace tessera
