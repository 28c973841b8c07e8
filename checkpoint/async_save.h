// Async save: the snapshot is taken when async_save returns (a copy of every
// piece this rank owns, so later optimizer steps cannot leak into it; a
// device piece's copy is enqueued on a side stream, and the device's later
// work waits for it), and a background thread waits for the copies, then
// writes and commits the snapshot while training goes on. This is
// DCP's async_save: the training thread pays one memory copy of its own
// shards, the disk time is hidden.
//
// The background thread coordinates the ranks with collectives, so it must
// not share a process group with training: SaveOptions::group must be a group
// only checkpointing uses (CheckpointManager keeps one). With a null group,
// async_save splits one off the world for this save (a collective on the
// calling thread).
#pragma once

#include <functional>
#include <future>
#include <map>
#include <string>

#include "checkpoint/host_pieces.h"
#include "checkpoint/sharded_checkpoint.h"

namespace tessera::checkpoint {

class SaveHandle {
 public:
  SaveHandle() = default;
  explicit SaveHandle(std::shared_future<void> done) : done_(std::move(done)) {}

  // Blocks until the save is committed; rethrows its error (on every rank:
  // the ranks exchange their errors before committing).
  void wait() const;
  // True once the save has finished (committed or failed); true for an empty handle.
  bool ready() const;
  bool valid() const { return done_.valid(); }
  // Blocks until the save has finished, without rethrowing its error.
  void join() const;

 private:
  std::shared_future<void> done_;
};

// Buffers that snapshots copy into, kept from one async save to the next
// (CheckpointManager keeps one): after the first save a snapshot allocates
// nothing and faults in no new pages, it is only the copy. A snapshot into
// them first waits for the save that still reads them.
class SnapshotBuffers {
 public:
  // The kept host buffer for `name` when it has `like`'s shape and dtype,
  // else a new one (kept): page-locked when `like` is on a device (a run's
  // state stays on one device, so a kept buffer fits its tensor's device).
  Tensor buffer_for(const std::string& name, const Tensor& like);
  // The save that reads the buffers now.
  void set_reader(SaveHandle save) { reader_ = std::move(save); }
  void wait_for_reader() const { reader_.join(); }
  int64_t bytes() const;

 private:
  std::map<std::string, Tensor> buffers_;
  SaveHandle reader_;
};

// Copies this rank's owned pieces of `state` to a private snapshot in host
// memory: the state dict that async_save writes. Whole tensors are copied on
// rank 0 only (the rank that writes them); pieces this rank does not write
// are passed through uncopied (the save reads only their layout). With
// `buffers`, the copies go into them. Device pieces are copied on the
// device's checkpoint stream (host_pieces.h): snapshot_async returns before
// those copies have run, and the compute stream's later work is ordered after
// them; snapshot waits for them.
HostPieces snapshot_async(const DistributedStateDict& state, int rank, SnapshotBuffers* buffers = nullptr);
DistributedStateDict snapshot(const DistributedStateDict& state, int rank, SnapshotBuffers* buffers = nullptr);

// Collective: every rank calls it with the same directory. `after_commit`
// runs on the background thread once the save has committed (the manager
// prunes old checkpoints there). Dropping the last copy of the handle waits
// for the save.
SaveHandle async_save(const std::string& dir, const DistributedStateDict& state, SaveOptions options = {},
                      std::function<void()> after_commit = {}, SnapshotBuffers* buffers = nullptr);

}  // namespace tessera::checkpoint
