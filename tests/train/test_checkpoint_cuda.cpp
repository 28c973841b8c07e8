// Checkpoints, export and --init-from with the state on the cuda device (the
// simulator here): saves stage device-to-host through page-locked buffers,
// the async snapshot runs on a side stream ordered by events and never makes
// the host wait for the device, a cuda checkpoint resumes on cuda and on the
// cpu with the uninterrupted run's next losses, and an export of a cuda run
// starts a cpu or a cuda run and generates on cuda. Every case runs with the
// simulator's streams jittered: the stream-ordering checker raises any
// unordered access as an error, so a case that passes had none.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "train/checkpoint_manager.h"
#include "train/generation.h"
#include "train/model_loader.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "train/training_run.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/sim_stream.h"
#endif
#include "../checkpoint/temp_dir.h"
#include "tensor/cuda/transfer.h"
#include "tensor/host_staging.h"
#include "tensor/ops.h"
#include "tensor/stream.h"
#include "tests/train/cuda_device.h"

using tessera::train::TrainConfig;
using tessera::checkpoint::testing::TempDir;
namespace checkpoint = tessera::checkpoint;

using tessera::testing::kCuda;

namespace {

TrainConfig tiny_config(tessera::Device device, int64_t steps) {
  TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("tiny");
  config.seq_len = 16;
  config.batch = 2;
  config.steps = steps;
  config.warmup = std::min<int64_t>(2, steps);
  config.lr = 3e-3;
  config.eval_every = 0;
  config.threads = 1;
  config.device = device;
  return config;
}

#if TESSERA_HAVE_CUDA_SIM
// Every stream operation delayed by up to 100 us (seeded) while alive.
struct Jitter {
  explicit Jitter(uint64_t seed) { tessera::cuda::sim::set_stream_jitter(seed, 100); }
  ~Jitter() { tessera::cuda::sim::set_stream_jitter(0, 0); }
};
// How often the host has waited for a stream (the simulator counts it).
int64_t stream_synchronizations() { return tessera::cuda::sim::stream_synchronizations(); }
#else
struct Jitter {
  explicit Jitter(uint64_t) {}
};
int64_t stream_synchronizations() { return 0; }
#endif

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The losses of steps first..config.steps, from a fresh run or one resumed from `checkpoint_dir`.
std::vector<double> losses_after(const TrainConfig& config, const std::string& checkpoint_dir) {
  std::vector<double> losses;
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
    if (!checkpoint_dir.empty()) trainer.resume_from(checkpoint_dir);
    while (trainer.steps_done() < config.steps) losses.push_back(trainer.train_step().loss);
  });
  return losses;
}

// Every parameter of `trainer`'s model, on the host, by name.
std::map<std::string, std::vector<double>> parameter_values(tessera::train::Trainer& trainer) {
  std::map<std::string, std::vector<double>> values;
  for (const auto& [name, parameter] : trainer.model().named_parameters()) {
    values[name] = tessera::ops::to(parameter->tensor().detach(), tessera::kCPU).to_vector<double>();
  }
  return values;
}

}  // namespace

TEST_CASE("a cuda run checkpointed every step, sync and async, resumes on cuda bitwise and on the cpu within 1e-6") {
  Jitter jitter(5);
  TempDir tmp;
  const std::vector<double> uninterrupted = losses_after(tiny_config(kCuda, 4), "");
  REQUIRE(uninterrupted.size() == 4);

  for (const bool async : {false, true}) {
    CAPTURE(async);
    TrainConfig config = tiny_config(kCuda, 4);
    config.ckpt_dir = tmp / (async ? "async" : "sync");
    config.ckpt_every = 1;
    config.async_ckpt = async;
    std::ostringstream out;
    const tessera::train::TrainSummary summary = tessera::train::train(config, out);
    CHECK(summary.losses == uninterrupted);  // saving changes nothing
    REQUIRE(tessera::train::list_checkpoints(config.ckpt_dir).size() == 4);
  }
  // The same state written by a sync and an async save: the same bytes.
  for (const char* step : {"step-00000001", "step-00000002", "step-00000003", "step-00000004"}) {
    CAPTURE(step);
    CHECK(file_bytes(tmp / "sync" + "/" + step + "/rank-00000.safetensors") ==
          file_bytes(tmp / "async" + "/" + step + "/rank-00000.safetensors"));
  }

  const std::string saved = tmp / "async/step-00000002";
  const std::vector<double> on_cuda = losses_after(tiny_config(kCuda, 4), saved);
  CHECK(on_cuda == std::vector<double>{uninterrupted[2], uninterrupted[3]});
  tessera::cuda::reset_transfer_stats();
  const std::vector<double> on_cpu = losses_after(tiny_config(tessera::kCPU, 4), saved);
  CHECK(tessera::cuda::transfer_stats().host_to_device == 0);
  REQUIRE(on_cpu.size() == 2);
  double worst = 0.0;
  for (size_t index = 0; index < on_cpu.size(); ++index) {
    worst = std::max(worst, std::abs(on_cpu[index] - uninterrupted[index + 2]) / uninterrupted[index + 2]);
  }
  MESSAGE("resumed on the cpu: worst relative loss difference " << worst);
  CHECK(worst <= 1e-6);
}

TEST_CASE("loading a checkpoint into cuda tensors copies each tensor to the device once") {
  Jitter jitter(6);
  TempDir tmp;
  const TrainConfig config = tiny_config(kCuda, 1);
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
    trainer.train_step();
    checkpoint::save(tmp / "ckpt", trainer.state_dict(), {.group = distributed.world, .sync = false});
    tessera::train::Trainer fresh(config, tessera::train::build_data(config), distributed);
    const checkpoint::DistributedStateDict state = fresh.state_dict();
    int64_t on_device = 0;
    for (const auto& [name, entry] : state) {
      const tessera::Tensor& local = std::holds_alternative<tessera::Tensor>(entry)
                                         ? std::get<tessera::Tensor>(entry)
                                         : std::get<tessera::dist::DTensor>(entry).local();
      if (local.device().is_cuda() && local.numel() > 0) ++on_device;
    }
    tessera::cuda::reset_transfer_stats();
    checkpoint::load(tmp / "ckpt", state, {.group = distributed.world});
    CHECK(on_device > 0);
    CHECK(tessera::cuda::transfer_stats().host_to_device == on_device);
    CHECK(parameter_values(fresh) == parameter_values(trainer));
  });
}

TEST_CASE("an async save from cuda makes no synchronisation: a side stream copies, the writer waits on its event") {
  Jitter jitter(7);
  TempDir tmp;
  const TrainConfig config = tiny_config(kCuda, 3);
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
    tessera::train::CheckpointManager manager(tmp / "async", {.group = distributed.world, .sync = false});
    tessera::train::CheckpointManager reference(tmp / "sync", {.group = distributed.world, .sync = false});
    for (int64_t step = 1; step <= config.steps; ++step) {
      trainer.train_step();
      const nlohmann::json state = trainer.training_state();
      const int64_t before = stream_synchronizations();
      const int64_t reads = tessera::cuda::transfer_stats().device_to_host;
      manager.async_save(step, trainer.state_dict(), state);
      // The copies are enqueued (one per device tensor), the host waited for none of them.
      CHECK(stream_synchronizations() == before);
      CHECK(tessera::cuda::transfer_stats().device_to_host > reads);
      // The next optimizer step writes what is being copied: the compute
      // stream waits for the copies (else the ordering checker refuses it).
      reference.save(step, trainer.state_dict(), state);
    }
    manager.wait();
  });
  for (int64_t step = 1; step <= 3; ++step) {
    const std::string name = fmt::format("/step-{:08d}/rank-00000.safetensors", step);
    CAPTURE(name);
    CHECK(file_bytes(tmp / "async" + name) == file_bytes(tmp / "sync" + name));
  }
}

TEST_CASE("an export of a cuda run starts a cpu run and a cuda run (--init-from), and generates on cuda") {
  Jitter jitter(8);
  TempDir tmp;
  const std::string exported = tmp / "model.safetensors";
  TrainConfig config = tiny_config(kCuda, 2);
  config.export_path = exported;
  std::ostringstream out;
  tessera::train::train(config, out);

  for (const tessera::Device device : {tessera::kCPU, kCuda}) {
    CAPTURE(device.str());
    TrainConfig start = tiny_config(device, 1);
    start.init_from = exported;
    tessera::train::init_distributed(start, [&](const tessera::train::Distributed& distributed) {
      tessera::train::Trainer trainer(start, tessera::train::build_data(start), distributed);
      trainer.init_from(exported);
      for (const auto& [name, values] : parameter_values(trainer)) {
        CAPTURE(name);
        CHECK(checkpoint::read_safetensors_tensor(exported, name).to_vector<double>() == values);
      }
    });
  }

  // generate --device cuda: the export loaded, moved to the device, greedy tokens as on the cpu.
  const std::vector<uint32_t> prompt = {'T', 'h', 'e'};
  tessera::train::GenerationOptions greedy{.max_new_tokens = 8};
  greedy.sampling.temperature = 0.0;
  std::vector<std::vector<uint32_t>> tokens;
  for (const tessera::Device device : {tessera::kCPU, kCuda}) {
    const tessera::train::LoadedModel loaded = tessera::train::load_model_from_safetensors(exported);
    loaded.model->to(device);
    tokens.push_back(tessera::train::generate(*loaded.model, {prompt}, greedy).front().tokens);
  }
  CHECK(tokens[1].size() == prompt.size() + 8);
  CHECK(tokens[1] == tokens[0]);
}

#if TESSERA_HAVE_CUDA_SIM
TEST_CASE("the ordering checker refuses a write of a tensor the checkpoint stream is still copying, unless ordered") {
  // What the snapshot's compute->wait_event(copied) prevents: without it, the
  // next optimizer step would overwrite bytes the side stream has yet to read.
  tessera::Tensor source = tessera::ops::full({1000}, 1.0, {.device = kCuda});
  const std::shared_ptr<tessera::Stream> compute = tessera::current_stream(kCuda);
  const std::shared_ptr<tessera::Stream> side = tessera::Stream::create(kCuda);
  tessera::Event written;
  written.record(*compute);
  side->wait_event(written);
  const tessera::Tensor host = tessera::pinned_empty({1000}, tessera::DType::f32);
  const tessera::Event copied = tessera::copy_to_host_async(host, source, *side);
  CHECK_THROWS_WITH_AS(tessera::ops::fill_(source, 2.0), doctest::Contains("wait_event"), tessera::Error);
  compute->wait_event(copied);
  tessera::ops::fill_(source, 3.0);
  copied.synchronize();
  CHECK(host.to_vector<double>() == std::vector<double>(1000, 1.0));
  CHECK(tessera::ops::to(source, tessera::kCPU).to_vector<double>() == std::vector<double>(1000, 3.0));
}

// Checkpoints are device- and world-size-free: one 6-step run trains steps
// 1-2 on 4 ranks, 3-4 on 3 ranks resumed from that, and 5-6 on 4 ranks again
// (12 micro-batches a step: 3 a rank on 4 ranks, 4 on 3), with the first and
// last legs on 4 simulated GPUs and the middle one on the cpu; every step's
// loss is the all-cpu chain's within 1e-5 (relative).
TEST_CASE("a checkpoint saved on 4 simulated GPUs resumes on 3 cpu ranks, and theirs on 4 GPUs again") {
  Jitter jitter(11);
  TempDir tmp;
  struct Leg {
    int nproc;
    int64_t grad_accum;
    int64_t last_step;
    bool on_gpus;
  };
  const std::vector<Leg> legs = {{4, 3, 2, true}, {3, 4, 4, false}, {4, 3, 6, true}};
  // Every leg's losses (rank 0's), trained on the devices asked for or all on the cpu.
  auto chain = [&](const std::string& name, bool use_gpus) {
    std::vector<double> losses;
    std::string previous;
    for (size_t index = 0; index < legs.size(); ++index) {
      const Leg& leg = legs[index];
      TrainConfig config = tiny_config(use_gpus && leg.on_gpus ? kCuda : tessera::kCPU, 6);
      config.nproc = leg.nproc;
      config.grad_accum = leg.grad_accum;
      const std::string root = tmp / fmt::format("{}-{}", name, index);
      tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
        tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
        if (!previous.empty()) trainer.resume_from(previous);
        while (trainer.steps_done() < leg.last_step) {
          const double loss = trainer.train_step().loss;
          if (distributed.rank() == 0) losses.push_back(loss);
        }
        tessera::train::CheckpointManager checkpoints(root);
        checkpoints.save(trainer.steps_done(), trainer.state_dict(), trainer.training_state());
      });
      previous = tessera::train::checkpoint_path(root, leg.last_step);
    }
    return losses;
  };
  const std::vector<double> mixed = chain("mixed", true);
  const std::vector<double> cpu_only = chain("cpu", false);
  REQUIRE(mixed.size() == 6);
  REQUIRE(cpu_only.size() == 6);
  for (size_t step = 0; step < mixed.size(); ++step) {
    CAPTURE(step + 1);
    CHECK(std::abs(mixed[step] - cpu_only[step]) <= 1e-5 * cpu_only[step]);
  }
}
#endif
