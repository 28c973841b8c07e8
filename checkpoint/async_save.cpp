// Snapshot on the calling thread, write and commit on a background one.
#include "checkpoint/async_save.h"


#include "checkpoint/rank_errors.h"
#include "autograd/grad_mode.h"
#include "dist/launch.h"
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
  if (!buffer.defined() || buffer.sizes() != like.sizes() || buffer.dtype() != like.dtype() ||
      buffer.device() != like.device()) {
    buffer = ops::empty(like.sizes(), {.dtype = like.dtype(), .device = like.device()});
  }
  return buffer;
}

int64_t SnapshotBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& [name, buffer] : buffers_) total += buffer.nbytes();
  return total;
}

DistributedStateDict snapshot(const DistributedStateDict& state, int rank, SnapshotBuffers* buffers) {
  if (buffers != nullptr) buffers->wait_for_reader();
  autograd::NoGradGuard no_grad;  // copies the values of tensors that may require grad (live parameters)
  auto private_copy = [buffers](const std::string& name, const Tensor& tensor) {
    Tensor copy = buffers != nullptr ? buffers->buffer_for(name, tensor)
                                     : ops::empty(tensor.sizes(), {.dtype = tensor.dtype(), .device = tensor.device()});
    ops::copy_(copy, tensor);
    return copy;
  };
  DistributedStateDict copies;
  for (const auto& [name, entry] : state) {
    // What this rank does not write is never read by the save beyond its
    // dtype and layout, so it is not copied.
    if (!writes_piece(entry, rank)) {
      copies.emplace(name, entry);
    } else if (const Tensor* tensor = std::get_if<Tensor>(&entry)) {
      copies.emplace(name, private_copy(name, *tensor));
    } else {
      const dist::DTensor& dtensor = std::get<dist::DTensor>(entry);
      copies.emplace(name, dist::DTensor(private_copy(name, dtensor.local()), dtensor.mesh(), dtensor.placements(),
                                         dtensor.global_shape()));
    }
  }
  return copies;
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
  DistributedStateDict copies;
  try {
    copies = snapshot(state, rank, buffers);
  } catch (const std::exception& error) {
    snapshot_error = fmt::format("snapshot failed: {}", error.what());
  }
  // std::async's future waits in its destructor: a dropped handle joins the
  // writer instead of leaving it running past the state it reads.
  SaveHandle handle(std::async(std::launch::async, [dir, copies = std::move(copies), options, snapshot_error,
                                                    after_commit = std::move(after_commit)]() {
                       save_or_report(dir, copies, options, snapshot_error);
                       if (after_commit) after_commit();
                     }).share());
  if (buffers != nullptr) buffers->set_reader(handle);
  return handle;
}

}  // namespace tessera::checkpoint
