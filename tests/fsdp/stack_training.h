// Training a LayerStack (each Linear its own FSDP group) with AdamW on
// simulated GPUs or cpu ranks, for the stream-protocol and CPU-offload suites:
// rank 0's full weights after the run and every rank's device memory.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "fsdp/offloaded_optimizer_step.h"
#include "fsdp/state.h"
#include "fsdp/state_dict.h"
#include "fsdp/streams.h"
#include "nn/optim/adamw.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/sim/sim_stream.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tests/fsdp/layer_stack.h"

namespace tessera::fsdp::testing {

struct StackRun {
  int nproc = 2;
  int hsdp = 1;  // replicate x shard = hsdp x nproc / hsdp
  int steps = 2;
  ReshardAfterForward reshard = ReshardAfterForward::always();
  DeviceType device = DeviceType::cuda;  // cuda: rank r on simulated cuda:r
  std::optional<CPUOffloadPolicy> offload = std::nullopt;
  int micro_batches = 1;  // gradients synced on the last only
  // With offload: fsdp::OffloadedOptimizerStep, each step overlapped with the next forward.
  bool overlap_optimizer = false;
  // Makes the streams each rank's root shares, on the rank's device (a test's
  // FSDPStreams with one protocol step replaced); null: FSDP's own.
  std::function<std::shared_ptr<FSDPStreams>(Device)> streams = nullptr;
};

// `Streams` (FSDPStreams, or one with a protocol step replaced) on `device`:
// what StackRun::streams and the roots' lazy init take.
template <class Streams>
std::shared_ptr<FSDPStreams> make_streams(Device device) {
  return std::make_shared<Streams>(device);
}

struct StackResult {
  std::vector<std::vector<float>> weights;  // rank 0's full state dict, in name order
  // Per rank, on its device (cuda runs): the peak of the run, and what is
  // live after the last step (the optimizer stepped, gradients zeroed).
  std::vector<int64_t> device_peak_bytes;
  std::vector<int64_t> device_live_after_bytes;
  std::vector<bool> shards_on_host;  // per rank: every parameter shard and its optimizer state are cpu tensors
};

inline StackResult train_layer_stack(const StackRun& run) {
  StackResult result;
  result.device_peak_bytes.assign(static_cast<size_t>(run.nproc), 0);
  result.device_live_after_bytes.assign(static_cast<size_t>(run.nproc), 0);
  result.shards_on_host.assign(static_cast<size_t>(run.nproc), false);
  dist::run_local(run.nproc, [&](const dist::ProcessGroupPtr& world) {
    const auto rank = static_cast<size_t>(world->rank());
    const Device device = run.device == DeviceType::cuda ? Device(DeviceType::cuda, world->rank()) : kCPU;
    if (device.is_cuda()) {
      cuda::set_device(device.index);
      reset_peak_memory(device);
    }
    const dist::DeviceMesh mesh = run.hsdp > 1 ? dist::DeviceMesh(world, device, {run.hsdp, run.nproc / run.hsdp},
                                                                  {"replicate", "shard"})
                                               : dist::DeviceMesh(world, device, {run.nproc}, {"shard"});
    LayerStack model({24, 17, 33, 17, 24});
    for (const auto& layer : model.layers()) {
      fully_shard(*layer, {.mesh = mesh, .reshard_after_forward = run.reshard, .offload_policy = run.offload});
    }
    FSDPModule root = fully_shard(model, {.mesh = mesh, .offload_policy = run.offload});
    model.to_empty(device);
    model.reset_parameters(5);
    if (run.streams) model.extension<FSDPState>()->lazy_init(run.streams(device));
    optim::AdamW optimizer(model.named_parameters(), {.lr = 0.01});
    std::optional<OffloadedOptimizerStep> overlapped;
    if (run.overlap_optimizer) overlapped.emplace(model, optimizer);
    for (int step = 0; step < run.steps; ++step) {
      for (int micro = 0; micro < run.micro_batches; ++micro) {
        root.set_requires_gradient_sync(micro + 1 == run.micro_batches);
        const PhiloxKey key{static_cast<uint64_t>(world->rank()),
                            static_cast<uint64_t>(step * run.micro_batches + micro)};
        autograd::backward(model(ops::to(ops::randn({6, 24}, key), device)));
      }
      if (overlapped) {
        overlapped->wait();
        overlapped->start();
        continue;
      }
      optimizer.step();
      optimizer.zero_grad();
    }
    if (overlapped) overlapped->wait();
    bool on_host = true;
    for (const auto& [name, parameter] : model.named_parameters()) {
      on_host = on_host && parameter->tensor().device().is_cpu();
      for (const auto& [key, state] : optimizer.state(name)) on_host = on_host && state.device().is_cpu();
    }
    result.shards_on_host[rank] = on_host;
    if (device.is_cuda()) {
      current_stream(device)->synchronize();
      result.device_peak_bytes[rank] = memory_stats(device).peak_bytes;
      result.device_live_after_bytes[rank] = memory_stats(device).live_bytes;
    }
    const nn::StateDict full = full_state_dict(model);
    if (world->rank() != 0) return;
    for (const auto& [name, tensor] : full) result.weights.push_back(ops::to(tensor, kCPU).to_vector<float>());
  });
  return result;
}

// Every stream operation delayed by up to 100 us (seeded) while alive.
struct StreamJitter {
  explicit StreamJitter(uint64_t seed) { cuda::sim::set_stream_jitter(seed, 100); }
  ~StreamJitter() { cuda::sim::set_stream_jitter(0, 0); }
  StreamJitter(const StreamJitter&) = delete;
  StreamJitter& operator=(const StreamJitter&) = delete;
};

// Jitter seeds per mesh: TESSERA_STREAM_SEEDS, or 5 (docs/fsdp_on_gpus.md has a run of 100).
inline int stream_seeds() {
  const char* text = std::getenv("TESSERA_STREAM_SEEDS");
  return text == nullptr ? 5 : std::max(1, std::atoi(text));
}

}  // namespace tessera::fsdp::testing
