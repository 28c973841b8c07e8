// Staging a rank's written pieces into host memory, device pieces on a side stream.
#include "checkpoint/host_pieces.h"

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "tensor/host_staging.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace {

// One checkpoint stream per device, kept for the process: a stream must
// outlive the copies on it, and a snapshot returns before they have run.
std::shared_ptr<Stream> checkpoint_stream(Device device) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<Stream>> streams;
  std::lock_guard lock(mutex);
  std::shared_ptr<Stream>& stream = streams[device.str()];
  if (!stream) stream = Stream::create(device);
  return stream;
}

// A device piece waiting for its copy: the dense source and its host buffer.
struct PendingCopy {
  Tensor source;
  Tensor host;
};

}  // namespace

void HostPieces::wait() const {
  for (const Event& event : copied) event.synchronize();
}

Tensor new_host_buffer(const Tensor& like) {
  if (like.device().is_cpu()) return ops::empty(like.sizes(), {.dtype = like.dtype(), .device = kCPU});
  return pinned_empty(like.sizes(), like.dtype());
}

HostPieces stage_written_pieces(const DistributedStateDict& state, int rank, bool copy_host_pieces,
                                const HostBufferFor& buffer_for) {
  autograd::NoGradGuard no_grad;  // copies the values of tensors that may require grad (live parameters)
  HostPieces staged;
  std::map<std::string, std::vector<PendingCopy>> pending;  // by device
  std::map<std::string, Device> devices;
  auto host_copy = [&](const std::string& name, const Tensor& local) {
    if (local.device().is_cpu() && !copy_host_pieces) return local;
    Tensor host = buffer_for(name, local);
    if (local.device().is_cpu()) {
      ops::copy_(host, local);
    } else if (local.numel() > 0) {
      // A strided piece is made dense on its own stream first, so the copy reads one run of bytes.
      pending[local.device().str()].push_back({ops::contiguous(local), host});
      devices.emplace(local.device().str(), local.device());
    }
    return host;
  };
  for (const auto& [name, entry] : state) {
    if (!writes_piece(entry, rank)) {
      staged.state.emplace(name, entry);  // the save reads only its dtype and layout
    } else if (const Tensor* tensor = std::get_if<Tensor>(&entry)) {
      staged.state.emplace(name, host_copy(name, *tensor));
    } else if (const auto* boxed = std::get_if<BoxedPiece>(&entry)) {
      BoxedPiece host = *boxed;
      for (size_t index = 0; index < host.boxes.size(); ++index) {
        const std::string box_name = index == 0 ? name : fmt::format("{}#{}", name, index);
        host.boxes[index].local = host_copy(box_name, host.boxes[index].local);
      }
      staged.state.emplace(name, std::move(host));
    } else {
      const dist::DTensor& dtensor = std::get<dist::DTensor>(entry);
      staged.state.emplace(name, dist::DTensor(host_copy(name, dtensor.local()), dtensor.mesh(), dtensor.placements(),
                                               dtensor.global_shape()));
    }
  }
  for (const auto& [key, copies] : pending) {
    const Device device = devices.at(key);
    const std::shared_ptr<Stream> compute = current_stream(device);
    const std::shared_ptr<Stream> side = checkpoint_stream(device);
    Event written;  // everything the compute stream has enqueued: the pieces' last writes
    written.record(*compute);
    side->wait_event(written);
    for (const PendingCopy& copy : copies) copy_to_host_async(copy.host, copy.source, *side);
    Event copied;
    copied.record(*side);
    // The next writes of these tensors (the optimizer step) wait for the
    // copies on the device; the host goes on. The alternative, a device-side
    // copy first, would cost a second copy of the state in device memory.
    compute->wait_event(copied);
    staged.copied.push_back(copied);
  }
  return staged;
}

}  // namespace tessera::checkpoint
