// Checkpoints of tensor-parallel models reshard between any layouts: a model
// and its AdamW state saved on (dp 2, tp 2) load on (dp 4, tp 1), that one's
// save on (dp 1, tp 2), then on one rank, then on (replicate 2, dp 2, tp 2),
// and at every hop every parameter and every optimizer state, gathered whole,
// is bitwise the first layout's. GPT's fused qkv (3 boxes a rank, then FSDP's
// rows of them) and uneven vocabulary and SwiGLU shares included. The
// safetensors export of a split model is the 1-rank export byte for byte,
// and a 1-rank file imports into the pieces.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <atomic>
#include <map>
#include <mutex>

#include "autograd/engine.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/state_dict.h"
#include "dist/backends/local_backend.h"
#include "nn/optim/adamw.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/tp/composed_models.h"

using namespace tessera;
using namespace tessera::tp::testing;
using tessera::checkpoint::testing::TempDir;

namespace {

// (replicate, dp, tp); one rank holds the model whole, with no FSDP at all.
struct CheckpointLayout {
  int64_t replicate, dp, tp;
  int64_t world() const { return replicate * dp * tp; }
};

// The model on `layout`: split over tp when tp > 1, sharded by FSDP over the
// data ranks when there are several ranks, then initialised with `seed`.
std::shared_ptr<nn::CausalLM> model_on(const ComposedFactory& make, const dist::ProcessGroupPtr& world,
                                       const CheckpointLayout& layout, uint64_t seed) {
  auto model = make(kMeta);
  if (layout.world() > 1) {
    const ComposedMesh meshes = composed_mesh(world, layout.replicate, layout.dp, layout.tp);
    if (layout.tp > 1) tp::parallelize_causal_lm(*model, meshes.tp);
    for (auto& block : model->blocks()) fsdp::fully_shard(*block, {.mesh = meshes.fsdp});
    fsdp::fully_shard(*model, {.mesh = meshes.fsdp});
  }
  model->to_empty(kCPU);
  model->reset_parameters(seed);
  return model;
}

// Every parameter and optimizer state, gathered whole (collective).
std::map<std::string, Tensor> whole_state(nn::CausalLM& model, optim::AdamW& optimizer) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, parameter] : model.named_parameters()) {
    state["model." + name] = gathered(*parameter, parameter->tensor());
    for (const auto& [key, value] : optimizer.state(name)) {
      state["optim." + name + "." + key] = value.dim() == 0 ? ops::clone(value) : gathered(*parameter, value);
    }
  }
  return state;
}

void check_chain(const ComposedFactory& make) {
  const std::vector<CheckpointLayout> chain = {{1, 2, 2}, {1, 4, 1}, {1, 1, 2}, {1, 1, 1}, {2, 2, 2}};
  TempDir dirs;
  std::map<std::string, Tensor> first;
  for (size_t hop = 0; hop < chain.size(); ++hop) {
    const CheckpointLayout layout = chain[hop];
    CAPTURE(hop);
    CAPTURE(layout.replicate);
    CAPTURE(layout.dp);
    CAPTURE(layout.tp);
    std::map<std::string, Tensor> gathered_here;
    std::mutex mutex;
    dist::run_local(
        static_cast<int>(layout.world()),
        [&](const dist::ProcessGroupPtr& world) {
          auto model = model_on(make, world, layout, 100 + hop);  // each hop starts from other weights
          optim::AdamW optimizer(model->named_parameters(), {.lr = 1e-2});
          checkpoint::DistributedStateDict state = checkpoint::training_state_dict(*model, optimizer);
          if (hop == 0) {
            // A step, so that the optimizer's state is not zeros.
            const Tensor idx = global_tokens(2, 21);
            const int64_t data_rank = world->rank() / layout.tp;
            autograd::backward(model->loss(rows_of_dp_rank(idx, data_rank), rows_of_dp_rank(idx, data_rank)));
            optimizer.step();
          } else {
            checkpoint::load(dirs / fmt::format("hop-{}", hop - 1), state, {.group = world});
          }
          std::map<std::string, Tensor> whole = whole_state(*model, optimizer);
          checkpoint::save(dirs / fmt::format("hop-{}", hop), state, {.group = world});
          if (world->rank() == 0) {
            std::lock_guard lock(mutex);
            gathered_here = std::move(whole);
          }
        },
        thread_rank_options());
    if (hop == 0) {
      first = gathered_here;
      // A rank's k-th file holds the k-th box of its pieces: GPT's fused qkv
      // (3 boxes a tp rank; rank 0's FSDP rows of its piece meet 2 of them)
      // takes a second file, Llama's pieces one box each.
      const bool fused = first.count("model.blocks.0.attn.qkv.weight") == 1;
      CHECK(std::filesystem::exists(dirs / "hop-0/rank-00000-1.safetensors") == fused);
      continue;
    }
    REQUIRE(gathered_here.size() == first.size());
    for (const auto& [name, tensor] : first) {
      CAPTURE(name);
      CHECK(worst_difference(gathered_here.at(name), tensor) == 0.0);
    }
  }
}

}  // namespace

TEST_CASE("tp checkpoints: GPT (fused qkv, uneven vocabulary) reshards (2,2) -> (4,1) -> (1,2) -> 1 -> (2,2,2) bitwise") {
  check_chain(composed_models()[0].second);
}

TEST_CASE("tp checkpoints: Llama (uneven SwiGLU and vocabulary) reshards through the same chain bitwise") {
  check_chain(composed_models()[1].second);
}

TEST_CASE("tp exports: the safetensors file of a (dp 2, tp 2) model is the 1-rank model's, byte for byte") {
  TempDir dir;
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    const std::string whole_path = dir / (label + "-whole.safetensors");
    const std::string split_path = dir / (label + "-split.safetensors");
    dist::run_local(
        1,
        [&](const dist::ProcessGroupPtr& world) {
          auto model = model_on(make, world, {1, 1, 1}, 7);
          checkpoint::export_safetensors(whole_path, checkpoint::model_state(*model, ""), {.group = world});
        },
        thread_rank_options());
    dist::run_local(
        4,
        [&](const dist::ProcessGroupPtr& world) {
          auto model = model_on(make, world, {1, 2, 2}, 7);
          checkpoint::export_safetensors(split_path, checkpoint::model_state(*model, ""), {.group = world});
        },
        thread_rank_options());
    std::ifstream whole(whole_path, std::ios::binary), split(split_path, std::ios::binary);
    const std::string whole_bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
    const std::string split_bytes((std::istreambuf_iterator<char>(split)), std::istreambuf_iterator<char>());
    CHECK(whole_bytes.size() > 10000);
    CHECK(split_bytes == whole_bytes);
  }
}

TEST_CASE("tp imports: a 1-rank safetensors file into (dp 2, tp 2) pieces, each rank reading its boxes, bitwise") {
  TempDir dir;
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    std::map<std::string, Tensor> written;
    dist::run_local(
        1,
        [&](const dist::ProcessGroupPtr& world) {
          auto model = model_on(make, world, {1, 1, 1}, 9);
          checkpoint::export_safetensors(dir / (label + ".safetensors"), checkpoint::model_state(*model, ""),
                                         {.group = world});
          for (const auto& [name, parameter] : model->named_parameters()) {
            written[name] = ops::clone(parameter->tensor().detach());
          }
        },
        thread_rank_options());
    std::atomic<int> mismatches{0};
    dist::run_local(
        4,
        [&](const dist::ProcessGroupPtr& world) {
          auto model = model_on(make, world, {1, 2, 2}, 10);  // other weights, overwritten by the import
          checkpoint::import_safetensors(dir / (label + ".safetensors"), checkpoint::model_state(*model, ""));
          for (const auto& [name, parameter] : model->named_parameters()) {
            if (worst_difference(gathered(*parameter, parameter->tensor()), written.at(name)) != 0.0) ++mismatches;
          }
        },
        thread_rank_options());
    CHECK(mismatches == 0);
  }
}
