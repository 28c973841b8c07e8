// FSDP2's stream protocol on simulated GPUs (fsdp/streams.h), proven by the
// stream-ordering checker: with every stream operation delayed at random
// (seeded jitter), training on 2, 3 and 4 ranks, HSDP 2 x 2 and 4 ranks
// resharding to groups of 2 after forward raises no unordered access and
// ends with the unjittered run's weights bit for bit;
// a run stopped by an error (a rank killed as it issues a collective) leaves
// nothing unordered, for itself or the next run on the devices; with one wait
// removed or one buffer freed early (FSDPStreams with that step replaced) the
// checker stops the run, naming both operations.
#include <doctest/doctest.h>

#if TESSERA_HAVE_CUDA_SIM

#include <cstdlib>
#include <string>
#include <vector>

#include "dist/launch/fault_injection.h"
#include "tests/dist/error_message.h"
#include "tests/fsdp/stack_training.h"

using namespace tessera;
using namespace tessera::fsdp;
using tessera::test::message_of;
using tessera::fsdp::testing::LayerStack;
using tessera::fsdp::testing::make_streams;
using tessera::fsdp::testing::StackRun;
using tessera::fsdp::testing::StreamJitter;
using tessera::fsdp::testing::stream_seeds;
using tessera::fsdp::testing::train_layer_stack;

namespace {

// Rank 0's weights after `steps` AdamW steps of a stack of Linear layers, each
// its own FSDP group, on `nproc` simulated GPUs (rank r on cuda:r), as
// replicate x shard = hsdp x nproc / hsdp.
std::vector<std::vector<float>> train(int nproc, int hsdp, int steps,
                                      ReshardAfterForward reshard = ReshardAfterForward::always()) {
  return train_layer_stack({.nproc = nproc, .hsdp = hsdp, .steps = steps, .reshard = reshard}).weights;
}

// FSDP's streams with one step of the protocol replaced by nothing (streams.h).

// copy_in does not wait for compute.
struct CopyInSkipsComputeWait : FSDPStreams {
  using FSDPStreams::FSDPStreams;
  void order_copy_in_after_compute() override {}
};

// Compute's post-forward slot goes once its copy-in is enqueued.
struct PostForwardSlotFreedAtCopyIn : FSDPStreams {
  using FSDPStreams::FSDPStreams;
  Tensor keep_post_forward_slot(Tensor /*slot*/) const override { return {}; }
};

// The unsharded gradients go once their reduce-scatter copy-in is enqueued.
struct GradientsFreedAtCopyIn : FSDPStreams {
  using FSDPStreams::FSDPStreams;
  std::vector<Tensor> keep_gradients_read(std::vector<Tensor> /*gradients*/) const override { return {}; }
};

// The plan of injected faults while alive (dist/fault_injection.h).
struct FaultPlan {
  explicit FaultPlan(const std::string& plan) { dist::set_faults(dist::parse_faults(plan)); }
  ~FaultPlan() { dist::set_faults({}); }
  FaultPlan(const FaultPlan&) = delete;
  FaultPlan& operator=(const FaultPlan&) = delete;
};

}  // namespace

TEST_CASE("FSDP2's streams on simulated GPUs: jittered, no unordered access and the same weights, bit for bit") {
  struct Mesh {
    int nproc, hsdp, reshard_to;  // reshard_to: 0 for always, else the post-forward group's size
  };
  for (const Mesh mesh : {Mesh{2, 1, 0}, Mesh{3, 1, 0}, Mesh{4, 1, 0}, Mesh{4, 2, 0}, Mesh{4, 1, 2}}) {
    CAPTURE(mesh.nproc);
    CAPTURE(mesh.hsdp);
    CAPTURE(mesh.reshard_to);
    const ReshardAfterForward reshard =
        mesh.reshard_to == 0 ? ReshardAfterForward::always() : ReshardAfterForward::to_group_of(mesh.reshard_to);
    const std::vector<std::vector<float>> steady = train(mesh.nproc, mesh.hsdp, 2, reshard);
    REQUIRE(steady.size() == 8);
    for (int seed = 1; seed <= stream_seeds(); ++seed) {
      CAPTURE(seed);
      const StreamJitter jitter(static_cast<uint64_t>(seed));
      CHECK(train(mesh.nproc, mesh.hsdp, 2, reshard) == steady);
    }
  }
}

TEST_CASE("FSDP2's streams: an all-gather that fails as it is issued still orders compute after its copy-in") {
  // Every rank dies as it issues layers.1's all-gather, its third collective
  // (the mesh's split, then layers.0's and layers.1's all-gathers), once its
  // copy-in has read layers.1's shards. Each catches the error, reshards
  // (compute waits for the all-gather's event) and writes its shards on
  // compute, as an optimizer step would: the copy-in's reads must come first.
  const FaultPlan faults("kill@collective,at=3");
  std::vector<std::string> errors(2), writes(2);
  dist::run_local(2, [&](const dist::ProcessGroupPtr& world) {
    const auto rank = static_cast<size_t>(world->rank());
    const Device device(DeviceType::cuda, world->rank());
    cuda::set_device(device.index);
    const dist::DeviceMesh mesh(world, device, {2}, {"shard"});
    LayerStack model({24, 17, 33, 17, 24});
    std::vector<FSDPModule> layers;
    for (const auto& layer : model.layers()) layers.push_back(fully_shard(*layer, {.mesh = mesh}));
    fully_shard(model, {.mesh = mesh});
    model.to_empty(device);
    model.reset_parameters(5);
    errors[rank] = message_of([&] { model(ops::to(ops::randn({6, 24}, PhiloxKey{rank, 0}), device)); });
    for (FSDPModule& layer : layers) layer.reshard();
    writes[rank] = message_of([&] {
      for (const auto& [name, parameter] : model.named_parameters()) ops::zero_(parameter->tensor());
    });
  });
  for (size_t rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].starts_with(
        fmt::format("injected fault kill@collective,at=3: the rank died at world rank {}'s all_gather_into", rank)));
    CHECK(writes[rank] == "(no error)");
  }
}

TEST_CASE("FSDP2's streams: a run stopped at any collective leaves nothing unordered for the next run") {
  // Rank 1 dies as it issues its k-th collective, for each k from its first
  // all-gather (its first collective is the mesh's split) to the last
  // reduce-scatter of its second step; rank 0 fails on the collectives it left.
  // The next run takes the blocks the stopped one freed, on streams of its
  // own: whatever a side stream of the stopped run read or wrote must be
  // ordered before those blocks went, so the next run trains as a clean one.
  const StackRun run{.nproc = 2, .steps = 2};
  const std::vector<std::vector<float>> clean = train_layer_stack(run).weights;
  for (int at = 2; at <= 25; ++at) {
    CAPTURE(at);
    const std::string fault = fmt::format("kill@collective,rank=1,at={}", at);
    {
      const FaultPlan faults(fault);
      CHECK(message_of([&] { train_layer_stack(run); }).starts_with("injected fault " + fault + ": "));
    }
    CHECK(train_layer_stack(run).weights == clean);
  }
}

TEST_CASE("FSDP2's streams: a copy-in that does not wait for compute is caught, naming both operations") {
  // Caught at the first copy-in: it reads a shard the initialisation's
  // kernel wrote on compute.
  const std::string message =
      message_of([] { train_layer_stack({.nproc = 2, .steps = 2, .streams = make_streams<CopyInSkipsComputeWait>}); });
  CAPTURE(message);
  // (on whichever rank's checker speaks first)
  CHECK(message.starts_with("stream-order checker: `copy_segments_kernel` on cuda:"));
  CHECK(message.find("which `random_kernel<T>` on cuda:") != std::string::npos);
  CHECK(message.find("with no event or synchronize between them") != std::string::npos);
}

TEST_CASE("FSDP2's streams: a post-forward slot freed once its copy-in is enqueued is caught, naming both operations") {
  // reshard_after_forward = 2 on 4 ranks: backward's all-gather copies each
  // layer in from the slot its forward kept, a buffer of the compute stream.
  StackRun run{.nproc = 4, .steps = 2, .reshard = ReshardAfterForward::to_group_of(2),
               .streams = make_streams<FSDPStreams>};
  CHECK(train_layer_stack(run).weights.size() == 8);
  // Compute reuses the slot's block (a GEMM writes it) under the copy-in
  // still reading it.
  run.streams = make_streams<PostForwardSlotFreedAtCopyIn>;
  const std::string message = message_of([&] { train_layer_stack(run); });
  CHECK(message.starts_with("stream-order checker: "));
  CHECK(message.find("`(copy_kernel<To, From>)`") != std::string::npos);
  CHECK(message.find("with no event or synchronize between them") != std::string::npos);
}

TEST_CASE("FSDP2's streams: unsharded gradients freed once their reduce-scatter copy-in is enqueued are caught") {
  // Compute reuses a gradient's block while the reduce-scatter stream still
  // copies it in.
  const std::string message =
      message_of([] { train_layer_stack({.nproc = 2, .steps = 2, .streams = make_streams<GradientsFreedAtCopyIn>}); });
  // (which compute kernel reuses the block first varies with the ranks' timing)
  CHECK(message.starts_with("stream-order checker: "));
  CHECK(message.find("with no event or synchronize between them") != std::string::npos);
}

#endif  // TESSERA_HAVE_CUDA_SIM
