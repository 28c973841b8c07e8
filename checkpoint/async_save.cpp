// Snapshot on the calling thread, write and commit on a background one.
#include "checkpoint/async_save.h"

#include "checkpoint/rank_errors.h"
#include "dist/init.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

void SaveHandle::wait() const {
  if (done_.valid()) done_.get();
}

void SaveHandle::join() const {
  if (done_.valid()) done_.wait();
}

bool SaveHandle::ready() const {
  return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

Tensor SnapshotBuffers::buffer_for(const std::string& name, const Tensor& like) {
  Tensor& buffer = buffers_[name];
  if (!buffer.defined() || buffer.sizes() != like.sizes() || buffer.dtype() != like.dtype()) {
    buffer = new_host_buffer(like);  // page-locked for a device tensor, whose copy runs asynchronously
  }
  return buffer;
}

int64_t SnapshotBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& [name, buffer] : buffers_) total += buffer.nbytes();
  return total;
}

HostPieces snapshot_async(const DistributedStateDict& state, int rank, SnapshotBuffers* buffers) {
  if (buffers != nullptr) buffers->wait_for_reader();
  const HostBufferFor buffer_for = [buffers](const std::string& name, const Tensor& like) {
    return buffers != nullptr ? buffers->buffer_for(name, like) : new_host_buffer(like);
  };
  return stage_written_pieces(state, rank, true, buffer_for);
}

DistributedStateDict snapshot(const DistributedStateDict& state, int rank, SnapshotBuffers* buffers) {
  HostPieces copies = snapshot_async(state, rank, buffers);
  copies.wait();
  return std::move(copies.state);
}

SaveHandle async_save(const std::string& dir, const DistributedStateDict& state, SaveOptions options,
                      std::function<void()> after_commit, SnapshotBuffers* buffers) {
  if (!options.group) {
    // The background thread's collectives need a group of their own.
    if (const dist::ProcessGroupPtr world = dist::world_or_null()) {
      std::vector<int> everyone(static_cast<size_t>(world->size()));
      for (int rank = 0; rank < world->size(); ++rank) everyone[static_cast<size_t>(rank)] = rank;
      options.group = world->split(everyone, "checkpoint");
    }
  }
  const int rank = rank_of(options.group);
  // A rank whose snapshot fails still joins the save's collectives and
  // reports the error there, so no rank waits for it forever.
  std::string snapshot_error;
  HostPieces copies;
  try {
    copies = snapshot_async(state, rank, buffers);
  } catch (const std::exception& error) {
    snapshot_error = fmt::format("snapshot failed: {}", error.what());
  }
  // std::async's future waits in its destructor: a dropped handle joins the
  // writer instead of leaving it running past the state it reads.
  SaveHandle handle(std::async(std::launch::async, [dir, copies = std::move(copies), options, snapshot_error,
                                                    after_commit = std::move(after_commit)]() {
                       std::string error = snapshot_error;
                       try {
                         copies.wait();  // the device's copies into the host buffers
                       } catch (const std::exception& failure) {
                         if (error.empty()) error = fmt::format("snapshot failed: {}", failure.what());
                       }
                       save_or_report(dir, copies.state, options, error);
                       if (after_commit) after_commit();
                     }).share());
  if (buffers != nullptr) buffers->set_reader(handle);
  return handle;
}

}  // namespace tessera::checkpoint
