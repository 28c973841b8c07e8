// Model and optimizer state of FSDP training through a checkpoint: keyed by
// name, resharded from N ranks to M, async snapshots isolated from later steps.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>

#include "autograd/engine.h"
#include "checkpoint/async_save.h"
#include "checkpoint/state_dict.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "nn/optim/adamw.h"
#include "tensor/ops.h"
#include "tests/checkpoint/temp_dir.h"

using namespace tessera;
using namespace tessera::checkpoint;
using tessera::checkpoint::testing::TempDir;

namespace {

// Vocab 37 and width 24 over 3 heads: no world size of 2..8 divides every dim 0.
nn::GPTConfig awkward_config() {
  nn::GPTConfig config = nn::GPTConfig::preset("nano");
  config.vocab_size = 37;
  config.n_embd = 24;
  config.n_head = 3;
  return config;
}

// One rank's model (sharded over `group`, or whole without one) and AdamW.
struct Run {
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<optim::AdamW> optimizer;

  explicit Run(const dist::ProcessGroupPtr& group) {
    model = std::make_unique<nn::GPT>(awkward_config(), kMeta);
    if (group) {
      const dist::DeviceMesh mesh(group, kCPU, {group->size()});
      for (const auto& block : model->blocks()) fsdp::fully_shard(*block, {.mesh = mesh});
      fsdp::fully_shard(*model, {.mesh = mesh});
    }
    model->to_empty(kCPU);
    model->reset_parameters(5);
    optimizer = std::make_unique<optim::AdamW>(optim::weight_decay_groups(model->named_parameters(), 0.1),
                                               optim::AdamWOptions{.lr = 1e-2});
  }

  // One step on this rank's own batch (the data differs by rank and step).
  void step(int64_t index) {
    optimizer->zero_grad();
    std::vector<int64_t> tokens(2 * 9);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int64_t>(philox4x32(PhiloxKey{11, static_cast<uint64_t>(index)}, i)[0] % 37);
    }
    const Tensor sequences = ops::from_vector(tokens, {2, 9});
    autograd::backward(model->loss(ops::contiguous(ops::narrow(sequences, 1, 0, 8)),
                                   ops::contiguous(ops::narrow(sequences, 1, 1, 8))));
    optimizer->step();
  }
};

// Every entry gathered whole (a collective for DTensors), as f64 values.
std::map<std::string, std::vector<double>> full_values(const DistributedStateDict& state) {
  std::map<std::string, std::vector<double>> values;
  for (const auto& [name, entry] : state) {
    const Tensor whole = std::holds_alternative<Tensor>(entry) ? std::get<Tensor>(entry)
                                                               : std::get<dist::DTensor>(entry).full_tensor();
    values[name] = whole.to_vector<double>();
  }
  return values;
}

}  // namespace

TEST_CASE("checkpoint: optimizer state is keyed by parameter name and laid out like the parameter") {
  Run run(nullptr);
  const DistributedStateDict state = training_state_dict(*run.model, *run.optimizer);
  CHECK(state.count("model.wte.weight") == 1);
  CHECK(state.count("model.lm_head.weight") == 0);  // tied: listed once
  CHECK(state.count("optim.wte.weight.exp_avg") == 1);
  CHECK(state.count("optim.wte.weight.exp_avg_sq") == 1);
  CHECK(state.count("optim.blocks.0.attn.qkv.bias.step") == 1);
  // Every parameter has its three AdamW tensors, before any step.
  CHECK(state.size() == 4 * run.model->named_parameters().size());
  CHECK(std::get<Tensor>(state.at("optim.wte.weight.exp_avg")).sizes() == Shape{37, 24});
}

TEST_CASE("checkpoint: FSDP model and AdamW state saved on N ranks load on M ranks, bitwise") {
  for (const auto& [saved_ranks, loaded_ranks] : std::vector<std::pair<int, int>>{{1, 3}, {3, 2}, {4, 8}, {8, 1}, {2, 4}}) {
    CAPTURE(saved_ranks);
    CAPTURE(loaded_ranks);
    TempDir tmp;
    std::map<std::string, std::vector<double>> saved;
    dist::run_local(saved_ranks, [&](const dist::ProcessGroupPtr& group) {
      Run run(group);
      for (int64_t step = 0; step < 2; ++step) run.step(step * saved_ranks + group->rank());
      const DistributedStateDict state = training_state_dict(*run.model, *run.optimizer);
      save(tmp / "ckpt", state, {.group = group, .training_state = {{"step", 2}}});
      auto values = full_values(state);
      if (group->rank() == 0) saved = std::move(values);
    });
    std::atomic<int> mismatches{0};
    std::mutex names_mutex;
    std::vector<std::string> wrong_names;
    dist::run_local(loaded_ranks, [&](const dist::ProcessGroupPtr& group) {
      Run run(group);
      const DistributedStateDict state = training_state_dict(*run.model, *run.optimizer);
      const LoadReport report = load(tmp / "ckpt", state, {.group = group});
      if (report.training_state.at("step") != 2) ++mismatches;
      for (const auto& [name, values] : full_values(state)) {
        if (values == saved.at(name)) continue;
        ++mismatches;
        std::lock_guard lock(names_mutex);
        wrong_names.push_back(name);
      }
    });
    CHECK_MESSAGE(mismatches == 0, fmt::format("{}", fmt::join(wrong_names, ", ")));
    // Steps really happened: the saved optimizer state is not the initial zeros.
    CHECK(saved.at("optim.blocks.0.mlp.fc.weight.step") == std::vector<double>{2.0});
  }
}

TEST_CASE("checkpoint: an async save holds the state of the moment it was called") {
  TempDir tmp;
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    Run run(group);
    run.step(group->rank());
    const DistributedStateDict state = training_state_dict(*run.model, *run.optimizer);
    const auto at_call = full_values(state);
    const SaveHandle handle = async_save(tmp / "ckpt", state, {.training_state = {{"step", 1}}});
    // Training goes on while the background thread writes.
    for (int64_t step = 1; step < 4; ++step) run.step(step * 3 + group->rank());
    handle.wait();
    CHECK(handle.ready());
    const auto after_steps = full_values(state);
    CHECK(after_steps.at("model.wte.weight") != at_call.at("model.wte.weight"));

    Run fresh(group);
    const DistributedStateDict loaded = training_state_dict(*fresh.model, *fresh.optimizer);
    load(tmp / "ckpt", loaded, {.group = group});
    CHECK(full_values(loaded) == at_call);
  });
}

TEST_CASE("checkpoint: an async save's error surfaces at wait() on every rank") {
  TempDir tmp;
  std::filesystem::create_directories(tmp / "taken");
  std::atomic<int> errors{0};
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    const dist::DeviceMesh mesh(group, kCPU, {2});
    const DistributedStateDict state{{"x", dist::distribute(ops::ones({5, 2}), mesh, {dist::Shard{0}})}};
    const SaveHandle handle = async_save(tmp / "taken", state);
    try {
      handle.wait();
    } catch (const Error& error) {
      if (std::string(error.what()).find("already exists") != std::string::npos) ++errors;
    }
  });
  CHECK(errors == 2);
}

TEST_CASE("checkpoint: snapshot buffers are reused, and a snapshot waits for the save still reading them") {
  TempDir tmp;
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    Run run(group);
    SnapshotBuffers buffers;
    const DistributedStateDict state = training_state_dict(*run.model, *run.optimizer);
    const auto first_values = full_values(state);
    const SaveHandle first = async_save(tmp / "first", state, {}, {}, &buffers);
    const int64_t bytes = buffers.bytes();
    CHECK(bytes > 0);
    run.step(group->rank());
    const auto second_values = full_values(state);
    // No wait in between: the second snapshot must not overwrite what the first save is writing.
    const SaveHandle second = async_save(tmp / "second", state, {}, {}, &buffers);
    CHECK(buffers.bytes() == bytes);  // the same buffers, nothing new
    first.wait();
    second.wait();
    Run fresh(group);
    const DistributedStateDict loaded = training_state_dict(*fresh.model, *fresh.optimizer);
    load(tmp / "first", loaded, {.group = group});
    CHECK(full_values(loaded) == first_values);
    load(tmp / "second", loaded, {.group = group});
    CHECK(full_values(loaded) == second_values);
  });
}
