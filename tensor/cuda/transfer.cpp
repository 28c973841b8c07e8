#include "tensor/cuda/transfer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "tensor/cuda/deferred_errors.h"
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/operands.h"
#include "tensor/cuda/pinned_pool.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/stream.h"

namespace tessera::cuda {

namespace {

std::atomic<int64_t> host_to_device_copies{0}, device_to_host_copies{0}, bytes_to_device{0}, bytes_to_host{0};

// A cuda tensor with `tensor`'s shape and dtype, dense.
Tensor dense_on_device(const Tensor& like, Device device) {
  return ops::empty(like.sizes(), {.dtype = like.dtype(), .device = device});
}

// A pinned staging block, given back to the pool when the scope ends unless
// handed to the stream (back in the pool once an event recorded after the
// copy has completed).
class StagingBlock {
 public:
  explicit StagingBlock(int64_t bytes) : block_(acquire_pinned(bytes)) {}
  StagingBlock(const StagingBlock&) = delete;
  StagingBlock& operator=(const StagingBlock&) = delete;
  ~StagingBlock() { release_pinned(block_); }

  void* data() const { return block_.data; }
  // A dense cpu tensor like `like` over the block (the pool owns the bytes).
  Tensor host_view(const Tensor& like) const {
    return Tensor::make(Storage::adopt_host(block_.data, like.nbytes(), [](void*) {}), like.sizes(),
                        contiguous_strides(like.sizes()), 0, like.dtype());
  }
  void release_after(Stream& stream) {
    Event copied;
    copied.record(stream);
    release_pinned_after(block_, copied);
    block_ = PinnedBlock{};
  }

 private:
  PinnedBlock block_;
};

}  // namespace

void copy_host_to_device(const Tensor& dst, const Tensor& src) {
  const int64_t bytes = dst.nbytes();
  host_to_device_copies.fetch_add(1, std::memory_order_relaxed);
  bytes_to_device.fetch_add(bytes, std::memory_order_relaxed);
  const Tensor target = dst.is_contiguous() ? dst : dense_on_device(dst, dst.device());
  const std::shared_ptr<Stream> stream = current_stream(dst.device());
  // The source in the destination's dtype and shape, dense, straight into the staging block.
  StagingBlock staging(bytes);
  kernels(kCPU).copy(staging.host_view(target), src);
  memcpy_async(target.cuda_data(), staging.data(), bytes, CopyKind::host_to_device, *stream);
  staging.release_after(*stream);
  if (!dst.is_contiguous()) {
    copy(operand(dst), operand(target),
         launch_on_current_stream(dst.device(), {buffer_use("in", target, BufferAccess::read),
                                                  buffer_use("out", dst, BufferAccess::write)}));
  }
}

void copy_device_to_host(const Tensor& dst, const Tensor& src) {
  Tensor source = src;
  if (!src.is_contiguous()) {
    source = dense_on_device(src, src.device());
    copy(operand(source), operand(src),
         launch_on_current_stream(src.device(), {buffer_use("in", src, BufferAccess::read),
                                                  buffer_use("out", source, BufferAccess::write)}));
  }
  const int64_t bytes = source.nbytes();
  device_to_host_copies.fetch_add(1, std::memory_order_relaxed);
  bytes_to_host.fetch_add(bytes, std::memory_order_relaxed);
  const std::shared_ptr<Stream> stream = current_stream(src.device());
  const StagingBlock staging(bytes);
  memcpy_async(staging.data(), source.cuda_data(), bytes, CopyKind::device_to_host, *stream);
  stream->synchronize();
  raise_deferred_errors(*stream);
  kernels(kCPU).copy(dst, staging.host_view(source));
}

namespace {

// The checks of both asynchronous copies: dense tensors of one dtype and size,
// one on the cpu and one on cuda.
// One asynchronous copy between `host` (dense cpu) and `device` (dense
// cuda) of one dtype and size, `kind` saying which way, counted and
// enqueued on `stream`; the Event completes once the copy has run, and the
// host bytes are kept alive until then, whatever the caller drops.
Event copy_async(const char* caller, const Tensor& host, const Tensor& device, CopyKind kind, Stream& stream) {
  TESSERA_CHECK(host.device().is_cpu() && device.device().is_cuda() && host.is_contiguous() &&
                    device.is_contiguous() && host.dtype() == device.dtype() && host.numel() == device.numel(),
                "{}: needs a dense cpu tensor and a dense cuda tensor of one dtype and size, got {} {} {} on {} and "
                "{} {} {} on {}",
                caller, dtype_name(host.dtype()), host.sizes(), host.is_contiguous() ? "dense" : "strided",
                host.device().str(), dtype_name(device.dtype()), device.sizes(),
                device.is_contiguous() ? "dense" : "strided", device.device().str());
  const int64_t bytes = host.nbytes();
  const bool to_host = kind == CopyKind::device_to_host;
  (to_host ? device_to_host_copies : host_to_device_copies).fetch_add(1, std::memory_order_relaxed);
  (to_host ? bytes_to_host : bytes_to_device).fetch_add(bytes, std::memory_order_relaxed);
  if (to_host) {
    memcpy_async(host.raw_data(), device.cuda_data(), bytes, kind, stream);
  } else {
    memcpy_async(device.cuda_data(), host.raw_data(), bytes, kind, stream);
  }
  Event copied;
  copied.record(stream);
  hold_until(copied, host.storage());
  return copied;
}

}  // namespace

Event copy_device_to_host_async(const Tensor& dst, const Tensor& src, Stream& stream) {
  return copy_async("copy_device_to_host_async", dst, src, CopyKind::device_to_host, stream);
}

Event copy_host_to_device_async(const Tensor& dst, const Tensor& src, Stream& stream) {
  return copy_async("copy_host_to_device_async", src, dst, CopyKind::host_to_device, stream);
}

Tensor pinned_host_empty(const Shape& sizes, DType dtype) {
  const int64_t bytes = shape_numel(sizes) * static_cast<int64_t>(element_size(dtype));
  void* pinned = pinned_host_malloc(std::max<int64_t>(bytes, 1));
  TESSERA_CHECK(pinned != nullptr, "pinned_host_empty: no {} bytes of page-locked host memory", bytes);
  return Tensor::make(Storage::adopt_host(pinned, bytes, pinned_host_free), sizes, contiguous_strides(sizes), 0, dtype);
}

TransferStats transfer_stats() {
  return {.host_to_device = host_to_device_copies.load(),
          .device_to_host = device_to_host_copies.load(),
          .bytes_to_device = bytes_to_device.load(),
          .bytes_to_host = bytes_to_host.load()};
}

void reset_transfer_stats() {
  host_to_device_copies = 0;
  device_to_host_copies = 0;
  bytes_to_device = 0;
  bytes_to_host = 0;
}

}  // namespace tessera::cuda
