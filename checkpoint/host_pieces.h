// The pieces of a state dict that a rank writes, brought to host memory for
// a save. Pieces on a device are copied into page-locked host buffers on the
// device's checkpoint stream, a side stream that waits on an Event recorded
// on the compute (current) stream; the copies' completion is an Event the
// reader waits on, and the compute stream waits on it too, so the next write
// of a snapshotted tensor (the optimizer step) runs after the copy has read
// it. The host never synchronizes with the device here.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "tensor/stream.h"

namespace tessera::checkpoint {

// The staged state dict: every piece this rank writes is a host tensor once
// wait() returns. Entries this rank does not write pass through uncopied.
struct HostPieces {
  DistributedStateDict state;
  std::vector<Event> copied;  // one per device with pieces: complete when the host buffers hold the bytes

  void wait() const;
};

// Where the copy of the piece `name` shaped like `like` goes: a dense host
// tensor of like's shape and dtype (page-locked when `like` is on a device).
using HostBufferFor = std::function<Tensor(const std::string& name, const Tensor& like)>;

// Stages the pieces this rank writes: device pieces always (into
// `buffer_for`'s buffers), host pieces only when `copy_host_pieces` (a
// snapshot that later steps must not change), else passed through as they are.
HostPieces stage_written_pieces(const DistributedStateDict& state, int rank, bool copy_host_pieces,
                                const HostBufferFor& buffer_for);

// A new buffer for `like`: pinned for a device tensor, ordinary memory for a host one.
Tensor new_host_buffer(const Tensor& like);

}  // namespace tessera::checkpoint
