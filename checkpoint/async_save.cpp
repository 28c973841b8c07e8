// Snapshot on the calling thread, write and commit on a background one.
#include "checkpoint/async_save.h"


#include "dist/launch.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

void SaveHandle::wait() const {
  if (done_.valid()) done_.get();
}

bool SaveHandle::ready() const {
  return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

namespace {

Tensor private_copy(const Tensor& tensor) {
  Tensor copy = ops::empty(tensor.sizes(), {.dtype = tensor.dtype(), .device = tensor.device()});
  ops::copy_(copy, tensor);
  return copy;
}

}  // namespace

DistributedStateDict snapshot(const DistributedStateDict& state, int rank) {
  DistributedStateDict copies;
  for (const auto& [name, entry] : state) {
    // What this rank does not write is never read by the save beyond its
    // dtype and layout, so it is not copied.
    if (!writes_piece(entry, rank)) {
      copies.emplace(name, entry);
    } else if (const Tensor* tensor = std::get_if<Tensor>(&entry)) {
      copies.emplace(name, private_copy(*tensor));
    } else {
      const dist::DTensor& dtensor = std::get<dist::DTensor>(entry);
      copies.emplace(name, dist::DTensor(private_copy(dtensor.local()), dtensor.mesh(), dtensor.placements(),
                                         dtensor.global_shape()));
    }
  }
  return copies;
}

SaveHandle async_save(const std::string& dir, const DistributedStateDict& state, SaveOptions options,
                      std::function<void()> after_commit) {
  if (!options.group) {
    // The background thread's collectives need a group of their own.
    if (const dist::ProcessGroupPtr world = dist::world_or_null()) {
      std::vector<int> everyone(static_cast<size_t>(world->size()));
      for (int rank = 0; rank < world->size(); ++rank) everyone[static_cast<size_t>(rank)] = rank;
      options.group = world->split(everyone, "checkpoint");
    }
  }
  const int rank = options.group ? options.group->rank() : 0;
  // A rank whose snapshot fails still joins the save's collectives and
  // reports the error there, so no rank waits for it forever.
  std::string snapshot_error;
  DistributedStateDict copies;
  try {
    copies = snapshot(state, rank);
  } catch (const std::exception& error) {
    snapshot_error = fmt::format("snapshot failed: {}", error.what());
  }
  // std::async's future waits in its destructor: a dropped handle joins the
  // writer instead of leaving it running past the state it reads.
  return SaveHandle(std::async(std::launch::async, [dir, copies = std::move(copies), options, snapshot_error,
                                                     after_commit = std::move(after_commit)]() {
                      save_or_report(dir, copies, options, snapshot_error);
                      if (after_commit) after_commit();
                    }).share());
}

}  // namespace tessera::checkpoint
