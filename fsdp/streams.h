// fsdp::FSDPStreams: FSDP2's streams on a device that has its own (cuda).
//
//   compute        -- the caller's current stream: forward, backward, optimizer
//   copy_in        -- all-gather copy-in: shards into this rank's slot
//   all_gather     -- issues the all-gathers (the group's stream runs them)
//   reduce_scatter -- gradient copy-in, the reduce-scatter's issue, and the
//                     reduced gradients' accumulation into the shards
//   all_reduce     -- HSDP's all-reduce over the replicas
//
// unshard: copy_in waits for compute (the optimizer wrote the shards), then
// allocates the all-gather buffer and copies in; all_gather waits for that
// and issues the collective, whose own stream waits for all_gather. The
// compute stream waits for the collective before copy-out, and copy_in for
// the copy-out before the buffer goes.
//
// Lifetimes are held by events, not record_stream: a buffer goes once the
// stream it belongs to has waited for every other stream's use of it, so
// the event the allocator records at its free covers them all, whichever
// stream takes the block next (the next run's, too, after an error). The
// all-gather buffer is copy_in's, read by compute's copy-out. Compute's
// buffers that copy_in reads (the post-forward slot of
// reshard_after_forward = N) are kept until compute has waited for the
// all-gather, which waited for copy_in: a block freed earlier could be
// reused by compute under the copy still reading it. Unwinding from an
// error, compute waits for every side stream before the groups' shards and
// gradients go.
//
// backward: reduce_scatter waits for compute (the gradients are written),
// copies them in and issues the collective. The previous group's reduce-
// scatter is finished there too (at most one in flight): its stream waits
// for the collective, HSDP's all_reduce stream runs the all-reduce, and the
// sums are divided and added into the sharded gradients, all off compute.
// The unsharded gradients the copy-in read are compute's: they are kept
// until compute has waited for the copy-in's event. At the end of backward
// compute waits for reduce_scatter, before anything reads the gradients.
//
// Under CPU offload the host is one more party: it reads the reduced
// gradients only after their copy to the host has run, and writes the
// shards only after every copy that reads them has.
//
// On the cpu every stream is the caller's: the work runs in issue order and
// nothing is held.
#pragma once

#include <memory>
#include <vector>

#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace tessera::fsdp {

class FSDPStreams {
 public:
  explicit FSDPStreams(Device device);
  virtual ~FSDPStreams() = default;
  FSDPStreams(const FSDPStreams&) = delete;
  FSDPStreams& operator=(const FSDPStreams&) = delete;

  // Whether the streams are separate from compute (the device has streams).
  bool separate() const { return separate_; }
  Device device() const { return device_; }
  const std::shared_ptr<Stream>& copy_in() const { return copy_in_; }
  const std::shared_ptr<Stream>& all_gather() const { return all_gather_; }
  const std::shared_ptr<Stream>& reduce_scatter() const { return reduce_scatter_; }
  const std::shared_ptr<Stream>& all_reduce() const { return all_reduce_; }

  // Makes `later` wait for `earlier`'s work so far (no-op on the cpu).
  void order(Stream& later, Stream& earlier);
  // Makes all_gather wait for copy_in's work so far.
  void order_all_gather_after_copy_in();
  // Makes compute wait for `stream`'s work so far (no-op on the cpu).
  void order_compute_after(Stream& stream);

  // ---- the steps whose absence the checker is shown to catch ---------------------------
  // Each is virtual for one reason: a test derives FSDPStreams, replaces one
  // step with nothing and hands its streams to the root's lazy init; the
  // simulator's stream-ordering checker must then stop the run, naming both
  // operations (tests/fsdp/test_stream_protocol.cpp, test_cpu_offload.cpp).
  // A seam on this object rather than a test switch read inside the steps:
  // the library's code is the protocol alone, and FSDP's own streams cost
  // an indirect call a step.

  // Makes copy_in wait for compute's work so far (the optimizer wrote the shards).
  virtual void order_copy_in_after_compute();
  // What unshard holds of compute's post-forward slot, which copy_in has
  // just read, until compute has waited for the all-gather: the slot (nothing
  // on the cpu).
  virtual Tensor keep_post_forward_slot(Tensor slot) const;
  // What the reduce-scatter holds of compute's unsharded gradients, which
  // its copy-in has just read, until compute has waited for the copy-in: the
  // gradients (nothing on the cpu).
  virtual std::vector<Tensor> keep_gradients_read(std::vector<Tensor> gradients) const;
  // CPU offload: blocks the host until `landed` (the reduced gradients'
  // copy to the host) is reached, before it reads them.
  virtual void host_waits_for_gradients(const Event& landed) const;
  // CPU offload: blocks the host until `read` (the latest copy of the shards
  // to the device) is reached, before it writes them.
  virtual void host_waits_for_shard_reads(const Event& read) const;

 private:
  Device device_;
  bool separate_;
  std::shared_ptr<Stream> copy_in_;
  std::shared_ptr<Stream> all_gather_;
  std::shared_ptr<Stream> reduce_scatter_;
  std::shared_ptr<Stream> all_reduce_;
};

}  // namespace tessera::fsdp
