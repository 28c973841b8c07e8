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
// compute stream waits for the collective before copy-out.
//
// Lifetimes are held by events, not record_stream. The all-gather buffer
// is copy_in's: a block freed there is reused only by a later allocation on
// copy_in, and each comes after copy_in waited for compute, so after every
// copy-out before it; its buffer can go as soon as copy-out is enqueued.
// Compute's buffers that copy_in reads (the post-forward slot of
// reshard_after_forward = N) are kept until compute has waited for the
// all-gather, which waited for copy_in: a block freed earlier could be
// reused by compute under the copy still reading it.
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
// On the cpu every stream is the caller's: the work runs in issue order and
// nothing is held.
#pragma once

#include <memory>

#include "tensor/stream.h"

namespace tessera::fsdp {

class FSDPStreams {
 public:
  explicit FSDPStreams(Device device);

  // Whether the streams are separate from compute (the device has streams).
  bool separate() const { return separate_; }
  Device device() const { return device_; }
  const std::shared_ptr<Stream>& copy_in() const { return copy_in_; }
  const std::shared_ptr<Stream>& all_gather() const { return all_gather_; }
  const std::shared_ptr<Stream>& reduce_scatter() const { return reduce_scatter_; }
  const std::shared_ptr<Stream>& all_reduce() const { return all_reduce_; }

  // Makes `later` wait for `earlier`'s work so far (no-op on the cpu).
  void order(Stream& later, Stream& earlier);
  // Makes copy_in wait for compute's work so far.
  void order_copy_in_after_compute();
  // Makes all_gather wait for copy_in's work so far.
  void order_all_gather_after_copy_in();
  // Makes compute wait for `stream`'s work so far (no-op on the cpu).
  void order_compute_after(Stream& stream);

 private:
  Device device_;
  bool separate_;
  std::shared_ptr<Stream> copy_in_;
  std::shared_ptr<Stream> all_gather_;
  std::shared_ptr<Stream> reduce_scatter_;
  std::shared_ptr<Stream> all_reduce_;
};

// Test-only switches that break the protocol on purpose, so a test can show
// the stream-ordering checker catches each break, naming both operations.
enum class ProtocolBreak {
  none,
  copy_in_skips_compute_wait,         // copy_in does not wait for compute
  post_forward_slot_freed_at_copy_in,  // compute's slot goes once its copy-in is enqueued
  gradients_freed_at_copy_in,          // the unsharded gradients go once their copy-in is enqueued
  // CPU offload: the host reads the reduced gradients without waiting for
  // their copy to the host / writes the shards without waiting for their
  // copies to the device.
  host_skips_gradient_wait,
  host_skips_shard_read_wait,
};
void set_protocol_break_for_testing(ProtocolBreak which);
ProtocolBreak protocol_break();

}  // namespace tessera::fsdp
