// CPU offload (fsdp/offload_policy.h): the shards, gradients and AdamW's
// state in host memory while simulated GPUs compute. Training matches CPU
// FSDP on the same ranks (within 1e-5: the GPUs' kernels round differently
// from the cpu's), for odd and even worlds, HSDP, resharding to groups of 2
// and gradient accumulation; nothing of the model is left on a GPU between
// steps, as the plan says; jittered streams change no bit and the
// stream-ordering checker stays silent. The optimizer step overlapped with
// the next forward (offloaded_optimizer_step.h) gives the same bits, and
// does overlap.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "fsdp/plan.h"
#include "tests/fsdp/layer_stack.h"
#if TESSERA_HAVE_CUDA_SIM
#include "autograd/grad_mode.h"
#include "fsdp/offloaded_optimizer_step.h"
#include "nn/optim/adamw.h"
#include "tests/dist/error_message.h"
#include "tests/fsdp/stack_training.h"
#endif

using namespace tessera;
using namespace tessera::fsdp;
using tessera::fsdp::testing::LayerStack;

namespace {

const OptimizerStateSize kAdamW{.description = "AdamW m and v", .copies = 2};

struct Mesh {
  int nproc, hsdp, reshard_to;  // reshard_to: 0 for always, else the post-forward group's size
  ReshardAfterForward reshard() const {
    return reshard_to == 0 ? ReshardAfterForward::always() : ReshardAfterForward::to_group_of(reshard_to);
  }
};

// The plan of the LayerStack the training below uses (stack_training.h).
ShardingPlan stack_plan(const Mesh& mesh, std::optional<CPUOffloadPolicy> offload) {
  LayerStack model({24, 17, 33, 17, 24});
  std::vector<PlannedCall> calls;
  for (const auto& layer : model.layers()) {
    calls.push_back({.module = layer.get(), .options = {.reshard_after_forward = mesh.reshard(),
                                                        .offload_policy = offload}});
  }
  calls.push_back({.module = &model, .options = {.offload_policy = offload}});
  return plan_fully_shard(calls, plan_mesh(mesh.nproc, mesh.hsdp));
}

}  // namespace

TEST_CASE("CPU offload in the plan: the device keeps the unsharded peak, the host the shards, gradients and state") {
  const ShardingPlan on_device = stack_plan({3, 1, 0}, std::nullopt);
  const ShardingPlan offloaded = stack_plan({3, 1, 0}, CPUOffloadPolicy{});
  CHECK(offloaded.shard_bytes == on_device.shard_bytes);
  CHECK(offloaded.peak.bytes == on_device.peak.bytes);
  CHECK(on_device.host_bytes(kAdamW) == 0);
  CHECK(on_device.device_bytes(kAdamW) ==
        on_device.shard_bytes + 3 * on_device.gradient_bytes + on_device.peak.bytes);
  CHECK(offloaded.offloaded_shard_bytes == offloaded.shard_bytes);
  CHECK(offloaded.offloaded_gradient_bytes == offloaded.gradient_bytes);
  CHECK(offloaded.device_bytes(kAdamW) == offloaded.peak.bytes);
  CHECK(offloaded.host_bytes(kAdamW) == offloaded.shard_bytes + 3 * offloaded.gradient_bytes);
  const std::string text = format_plan(offloaded, kAdamW);
  CHECK(text.find("on the device") != std::string::npos);
  CHECK(text.find("in host memory") != std::string::npos);
  CHECK(format_plan(on_device, kAdamW).find("in host memory") == std::string::npos);
}

#if TESSERA_HAVE_CUDA_SIM

using tessera::fsdp::testing::StackResult;
using tessera::fsdp::testing::StackRun;
using tessera::test::message_of;
using tessera::fsdp::testing::make_streams;
using tessera::fsdp::testing::StreamJitter;
using tessera::fsdp::testing::stream_seeds;
using tessera::fsdp::testing::train_layer_stack;

namespace {

// Every weight of `got` within 1e-5 of `want` (relative to 1 or the value).
bool close_weights(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  if (got.size() != want.size()) return false;
  for (size_t tensor = 0; tensor < got.size(); ++tensor) {
    if (got[tensor].size() != want[tensor].size()) return false;
    for (size_t i = 0; i < got[tensor].size(); ++i) {
      const double tolerance = 1e-5 * std::max(1.0, std::abs(static_cast<double>(want[tensor][i])));
      if (!(std::abs(static_cast<double>(got[tensor][i]) - want[tensor][i]) <= tolerance)) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("CPU offload on simulated GPUs trains as CPU FSDP does, and leaves nothing of the model on the GPUs") {
  for (const Mesh mesh : {Mesh{2, 1, 0}, Mesh{3, 1, 0}, Mesh{4, 2, 0}, Mesh{4, 1, 2}}) {
    CAPTURE(mesh.nproc);
    CAPTURE(mesh.hsdp);
    CAPTURE(mesh.reshard_to);
    const StackRun base{.nproc = mesh.nproc, .hsdp = mesh.hsdp, .steps = 3, .reshard = mesh.reshard()};
    StackRun on_cpu = base;
    on_cpu.device = DeviceType::cpu;
    const StackResult cpu = train_layer_stack(on_cpu);
    const StackResult gpu = train_layer_stack(base);
    for (const bool pinned : {true, false}) {
      CAPTURE(pinned);
      StackRun offloaded_run = base;
      offloaded_run.offload = CPUOffloadPolicy{.pin_memory = pinned};
      const StackResult offloaded = train_layer_stack(offloaded_run);
      CHECK(close_weights(offloaded.weights, cpu.weights));
      for (int rank = 0; rank < mesh.nproc; ++rank) {
        CAPTURE(rank);
        const auto at = static_cast<size_t>(rank);
        CHECK(offloaded.shards_on_host[at]);
        CHECK_FALSE(gpu.shards_on_host[at]);
        // Between steps nothing of the model is on the GPU; without offload
        // the shards and AdamW's m and v are.
        CHECK(offloaded.device_live_after_bytes[at] == 0);
        CHECK(gpu.device_live_after_bytes[at] > 0);
        // The step's peak without them (and the gradient shards held then).
        CHECK(offloaded.device_peak_bytes[at] <= gpu.device_peak_bytes[at] - gpu.device_live_after_bytes[at]);
      }
      // As the plan says: rank 0 holds the most real rows.
      const ShardingPlan plan = stack_plan(mesh, std::nullopt);
      CHECK(gpu.device_live_after_bytes[0] == plan.shard_bytes + kAdamW.copies * plan.gradient_bytes);
      const ShardingPlan offloaded_plan = stack_plan(mesh, CPUOffloadPolicy{});
      CHECK(offloaded_plan.device_bytes(kAdamW) == offloaded_plan.peak.bytes);
      CHECK(offloaded.device_peak_bytes[0] >= offloaded_plan.peak.bytes);
    }
  }
}

TEST_CASE("CPU offload under gradient accumulation matches CPU FSDP's accumulation") {
  const StackRun base{.nproc = 3, .hsdp = 1, .steps = 2, .micro_batches = 3};
  StackRun on_cpu = base;
  on_cpu.device = DeviceType::cpu;
  StackRun offloaded = base;
  offloaded.offload = CPUOffloadPolicy{};
  CHECK(close_weights(train_layer_stack(offloaded).weights, train_layer_stack(on_cpu).weights));
}

TEST_CASE("CPU offload's streams: jittered, no unordered access and the same weights, bit for bit") {
  for (const Mesh mesh : {Mesh{2, 1, 0}, Mesh{3, 1, 0}, Mesh{4, 2, 0}}) {
    CAPTURE(mesh.nproc);
    CAPTURE(mesh.hsdp);
    const StackRun run{.nproc = mesh.nproc, .hsdp = mesh.hsdp, .steps = 2, .offload = CPUOffloadPolicy{}};
    const std::vector<std::vector<float>> steady = train_layer_stack(run).weights;
    for (int seed = 1; seed <= stream_seeds(); ++seed) {
      CAPTURE(seed);
      const StreamJitter jitter(static_cast<uint64_t>(seed));
      CHECK(train_layer_stack(run).weights == steady);
    }
  }
}

namespace {

// The rank's compute stream, drained however the rank ends.
struct DrainOnExit {
  explicit DrainOnExit(Device device) : stream(current_stream(device)) {}
  ~DrainOnExit() {
    try {
      stream->synchronize();
    } catch (const std::exception&) {  // unwinding already: the rank's first error is the one reported
    }
  }
  DrainOnExit(const DrainOnExit&) = delete;
  DrainOnExit& operator=(const DrainOnExit&) = delete;
  std::shared_ptr<Stream> stream;
};

// FSDP's streams with one host-side step of the protocol replaced by nothing
// (streams.h).

// The host reads the reduced gradients without waiting for their copy to the host.
struct HostSkipsGradientWait : FSDPStreams {
  using FSDPStreams::FSDPStreams;
  void host_waits_for_gradients(const Event& /*landed*/) const override {}
};

// The host writes the shards without waiting for their copies to the device.
struct HostSkipsShardReadWait : FSDPStreams {
  using FSDPStreams::FSDPStreams;
  void host_waits_for_shard_reads(const Event& /*read*/) const override {}
};

}  // namespace

TEST_CASE("CPU offload: the host reading the reduced gradients before their copy has run is caught") {
  const std::string message = message_of([] {
    train_layer_stack(
        {.nproc = 2, .steps = 1, .offload = CPUOffloadPolicy{}, .streams = make_streams<HostSkipsGradientWait>});
  });
  CHECK(message.starts_with("stream-order checker: `fsdp: add the reduced gradients into the host's` on the host "
                            "reads host memory"));
  CHECK(message.find("which `memcpy device to host` on cuda:") != std::string::npos);
  CHECK(message.find("with no synchronize between them") != std::string::npos);
}

TEST_CASE("CPU offload: the host writing shards a copy to the device may still read is caught") {
  // A forward without backward leaves its copies unsynchronised; loading a
  // state dict then writes the shards on the host. It waits for the copies,
  // unless the streams skip that wait.
  using MakeStreams = std::shared_ptr<FSDPStreams> (*)(Device);
  const auto forward_then_load = [](MakeStreams streams) {
    dist::run_local(2, [streams](const dist::ProcessGroupPtr& world) {
      const Device device(DeviceType::cuda, world->rank());
      cuda::set_device(device.index);
      // The rank's compute stream is drained however the rank ends: a later
      // test's stream may reuse the blocks this one's copies read.
      const DrainOnExit drain(device);
      const dist::DeviceMesh mesh(world, device, {2}, {"shard"});
      LayerStack model({8, 6, 8});
      for (const auto& layer : model.layers()) {
        fully_shard(*layer, {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
      }
      fully_shard(model, {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
      model.to_empty(device);
      model.reset_parameters(1);
      model.extension<FSDPState>()->lazy_init(streams(device));
      const nn::StateDict weights = full_state_dict(model);
      {
        autograd::NoGradGuard no_grad;
        model(ops::to(ops::ones({2, 8}), device));
      }
      load_full_state_dict(model, weights);
    });
  };
  forward_then_load(make_streams<FSDPStreams>);
  const std::string message = message_of([&] { forward_then_load(make_streams<HostSkipsShardReadWait>); });
  CHECK(message.starts_with("stream-order checker: `load_full_state_dict` on the host writes host memory"));
  CHECK(message.find("which `memcpy host to device` on cuda:") != std::string::npos);
}

TEST_CASE("CPU offload with the optimizer step overlapped with the next forward: the same weights, bit for bit") {
  for (const Mesh mesh : {Mesh{2, 1, 0}, Mesh{3, 1, 0}, Mesh{4, 2, 0}, Mesh{4, 1, 2}}) {
    CAPTURE(mesh.nproc);
    CAPTURE(mesh.hsdp);
    CAPTURE(mesh.reshard_to);
    StackRun run{.nproc = mesh.nproc, .hsdp = mesh.hsdp, .steps = 3, .reshard = mesh.reshard(),
                 .offload = CPUOffloadPolicy{}};
    const std::vector<std::vector<float>> whole_step = train_layer_stack(run).weights;
    run.overlap_optimizer = true;
    CHECK(train_layer_stack(run).weights == whole_step);
    // Jittered streams: the checker sees each copy-in after its group's step.
    for (int seed = 1; seed <= stream_seeds(); ++seed) {
      CAPTURE(seed);
      const StreamJitter jitter(static_cast<uint64_t>(seed));
      CHECK(train_layer_stack(run).weights == whole_step);
    }
  }
  const StackRun accumulating{.nproc = 3, .steps = 2, .offload = CPUOffloadPolicy{}, .micro_batches = 3,
                              .overlap_optimizer = true};
  StackRun whole = accumulating;
  whole.overlap_optimizer = false;
  CHECK(train_layer_stack(accumulating).weights == train_layer_stack(whole).weights);
}

namespace {

// The rank's simulated GPU, made this thread's current device.
Device current_rank_device(const dist::ProcessGroupPtr& world) {
  cuda::set_device(world->rank());
  return {DeviceType::cuda, world->rank()};
}

// A LayerStack of 4 Linear groups on `world`'s simulated GPUs, offloaded.
struct OffloadedStack {
  explicit OffloadedStack(const dist::ProcessGroupPtr& world)
      : device(current_rank_device(world)), drain(device), model({8, 6, 8, 6, 8}) {
    const dist::DeviceMesh mesh(world, device, {world->size()}, {"shard"});
    for (const auto& layer : model.layers()) fully_shard(*layer, {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
    fully_shard(model, {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
    model.to_empty(device);
    model.reset_parameters(3);
  }
  void forward_backward() { autograd::backward(model(ops::to(ops::ones({2, 8}), device))); }

  Device device;
  DrainOnExit drain;
  LayerStack model;
};

}  // namespace

TEST_CASE("CPU offload, overlapped step: the next forward runs its first group while the last group steps") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& world) {
    OffloadedStack stack(world);
    optim::AdamW optimizer(stack.model.named_parameters(), {.lr = 0.01});
    OffloadedOptimizerStep step(stack.model, optimizer);
    // The last group's step holds on until the first layer's forward has run:
    // a step that did not overlap the forward would never see it.
    std::mutex mutex;
    std::condition_variable changed;
    bool first_layer_ran = false, waited_in_vain = false;
    const auto hook = stack.model.layers()[0].register_forward_hook(
        [&](nn::Module&, const nn::TensorList&, const Tensor&) -> std::optional<Tensor> {
          const std::lock_guard lock(mutex);
          first_layer_ran = true;
          changed.notify_all();
          return std::nullopt;
        });
    const size_t groups = stack.model.layers().size();  // the root has no parameters of its own
    stack.forward_backward();
    step.set_after_group_for_testing([&](size_t group) {
      if (group + 1 != groups) return;
      std::unique_lock lock(mutex);
      // Only a broken overlap waits this long: the forward is a few ms away.
      waited_in_vain = !changed.wait_for(lock, std::chrono::minutes(2), [&] { return first_layer_ran; });
    });
    step.start();
    stack.forward_backward();
    step.wait();
    CHECK_FALSE(waited_in_vain);
    CHECK(first_layer_ran);
  });
}

TEST_CASE("CPU offload: a first gradient is a view of the slot it landed in; backwards without zero_grad land in "
          "another slot and add") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& world) {
    OffloadedStack stack(world);
    const std::vector<nn::NamedParameter> parameters = stack.model.named_parameters();
    const auto gradients = [&] {
      std::vector<std::vector<float>> values;
      for (const auto& [name, parameter] : parameters) {
        REQUIRE(parameter->grad().defined());
        CHECK(parameter->grad().device().is_cpu());
        values.push_back(parameter->grad().to_vector<float>());
      }
      return values;
    };
    stack.forward_backward();
    const std::vector<std::vector<float>> once = gradients();
    // A layer's weight and bias came down in one slot: their gradients are
    // views of it, not copies.
    nn::Module& first = stack.model.layers()[0];
    const Tensor weight_grad = first.named_parameters()[0].second->grad();
    const Tensor bias_grad = first.named_parameters()[1].second->grad();
    CHECK(weight_grad.shares_storage_with(bias_grad));
    // Two more backwards: each lands in a slot no gradient views and adds
    // into the gradients, so they hold three times the first (2g is exact,
    // so 2g + g rounds as 3g does).
    stack.forward_backward();
    stack.forward_backward();
    const std::vector<std::vector<float>> thrice = gradients();
    REQUIRE(thrice.size() == once.size());
    for (size_t index = 0; index < once.size(); ++index) {
      CAPTURE(parameters[index].first);
      std::vector<float> expected = once[index];
      for (float& value : expected) value *= 3.0f;
      CHECK(thrice[index] == expected);
    }
    CHECK(first.named_parameters()[0].second->grad().shares_storage_with(weight_grad));
  });
}

TEST_CASE("CPU offload, overlapped step: an optimizer error reaches the next forward and wait(); misuse is refused") {
  // An optimizer whose every update fails.
  class FailingOptimizer : public optim::Optimizer {
   public:
    explicit FailingOptimizer(std::vector<nn::NamedParameter> params)
        : Optimizer({optim::ParamGroup{.params = std::move(params)}}, 0.1, 0.0, "FailingOptimizer") {}

   protected:
    void init_param_state(const Tensor&, optim::ParamState&) const override {}
    void update(Tensor&, const Tensor&, optim::ParamState&, const optim::ParamGroup&) override {
      fail("FailingOptimizer: this update fails");
    }
  };
  dist::run_local(2, [](const dist::ProcessGroupPtr& world) {
    OffloadedStack stack(world);
    FailingOptimizer optimizer(stack.model.named_parameters());
    OffloadedOptimizerStep step(stack.model, optimizer);
    stack.forward_backward();
    step.start();
    CHECK_THROWS_WITH_AS(step.start(), doctest::Contains("the previous step is still running; wait() for it first"),
                         Error);
    CHECK_THROWS_WITH_AS(stack.forward_backward(), "FailingOptimizer: this update fails", Error);
    CHECK_THROWS_WITH_AS(step.wait(), "FailingOptimizer: this update fails", Error);
    step.wait();  // reported once
  });
  dist::run_local(1, [](const dist::ProcessGroupPtr& world) {
    const Device device(DeviceType::cuda, 0);
    cuda::set_device(0);
    const dist::DeviceMesh mesh(world, device, {1}, {"shard"});
    LayerStack plain({4, 4});
    optim::AdamW plain_optimizer(plain.named_parameters(), {.lr = 0.01});
    CHECK_THROWS_WITH_AS(OffloadedOptimizerStep(plain, plain_optimizer),
                         doctest::Contains("this LayerStack is not an FSDP module"), Error);
    LayerStack on_device({4, 4});
    fully_shard(on_device.layers()[0], {.mesh = mesh});
    fully_shard(on_device, {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
    on_device.to_empty(device);
    optim::AdamW optimizer(on_device.named_parameters(), {.lr = 0.01});
    CHECK_THROWS_WITH_AS(OffloadedOptimizerStep(on_device, optimizer),
                         doctest::Contains("FSDP module 'layers.0' (Linear) is not offloaded"), Error);
    LayerStack offloaded({4, 4});
    fully_shard(offloaded, {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
    offloaded.to_empty(device);
    LayerStack other({4, 4});
    optim::AdamW other_optimizer(other.named_parameters(), {.lr = 0.01});
    CHECK_THROWS_WITH_AS(OffloadedOptimizerStep(offloaded, other_optimizer),
                         doctest::Contains("the optimizer's parameter 'layers.0.weight' is in no FSDP group of this "
                                           "LayerStack"),
                         Error);
  });
}

#endif  // TESSERA_HAVE_CUDA_SIM

TEST_CASE("CPU offload needs a mesh on the cuda device that computes") {
  dist::run_local(2, [](const dist::ProcessGroupPtr& world) {
    const dist::DeviceMesh mesh(world, kCPU, {2}, {"shard"});
    LayerStack model({4, 4});
    std::string message;
    try {
      fully_shard(model.layers()[0], {.mesh = mesh, .offload_policy = CPUOffloadPolicy{}});
    } catch (const Error& error) {
      message = error.what();
    }
    CHECK(message.starts_with("fully_shard(Linear): CPUOffloadPolicy needs a mesh on the cuda device that computes, "
                              "got DeviceMesh(cpu"));
    // A refused call leaves the module unsharded.
    CHECK_FALSE(model.layers()[0].named_parameters().front().second->is_sharded());
  });
}
