// FSDP2's streams and the events that order them (see streams.h).
#include "fsdp/streams.h"

#include <utility>

namespace tessera::fsdp {

FSDPStreams::FSDPStreams(Device device) : device_(device), separate_(device.is_cuda()) {
  if (separate_) {
    // High priority, as FSDP2's: a collective's copy should not queue behind compute.
    copy_in_ = Stream::create(device, -1);
    all_gather_ = Stream::create(device, -1);
    reduce_scatter_ = Stream::create(device, -1);
    all_reduce_ = Stream::create(device, -1);
  } else {
    copy_in_ = current_stream(device);
    all_gather_ = copy_in_;
    reduce_scatter_ = copy_in_;
    all_reduce_ = copy_in_;
  }
}

void FSDPStreams::order(Stream& later, Stream& earlier) {
  if (!separate_) return;
  Event done;
  done.record(earlier);
  later.wait_event(done);
}

void FSDPStreams::order_compute_after(Stream& stream) { order(*current_stream(device_), stream); }

void FSDPStreams::order_copy_in_after_compute() { order(*copy_in_, *current_stream(device_)); }

void FSDPStreams::order_all_gather_after_copy_in() { order(*all_gather_, *copy_in_); }

Tensor FSDPStreams::keep_post_forward_slot(Tensor slot) const { return separate_ ? std::move(slot) : Tensor(); }

std::vector<Tensor> FSDPStreams::keep_gradients_read(std::vector<Tensor> gradients) const {
  return separate_ ? std::move(gradients) : std::vector<Tensor>();
}

void FSDPStreams::host_waits_for_gradients(const Event& landed) const { landed.synchronize(); }

void FSDPStreams::host_waits_for_shard_reads(const Event& read) const { read.synchronize(); }

}  // namespace tessera::fsdp
