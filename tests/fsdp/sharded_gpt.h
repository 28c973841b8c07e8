// What the fsdp tests of the public API share: an awkwardly sized GPT
// (vocabulary 97, 3 heads of 24) sharded FSDP2's way through fully_shard.h
// alone, a training step on rank-dependent tokens, and the flat-buffer sizes
// recomputed from parameter shapes, so the figures tests expect do not come
// from FSDP's own layouts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "autograd/engine.h"
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "tensor/ops.h"

namespace tessera::fsdp::testing {

inline const nn::GPTConfig kAwkward{.vocab_size = 97, .block_size = 8, .n_layer = 3, .n_head = 3, .n_embd = 72};

struct ShardedGPT {
  std::unique_ptr<nn::GPT> model;
  std::vector<FSDPModule> blocks;
  std::optional<FSDPModule> root;
};

// Blocks, then the root (with the blocks' mixed precision), on `mesh`;
// allocated and initialised. `before_sharding` runs on the meta model first
// (to freeze parameters, say).
inline ShardedGPT build_sharded_gpt(const dist::DeviceMesh& mesh, FullyShardOptions block_options = {},
                                    FullyShardOptions root_options = {},
                                    const std::function<void(nn::GPT&)>& before_sharding = {}) {
  ShardedGPT sharded{std::make_unique<nn::GPT>(kAwkward, kMeta), {}, std::nullopt};
  if (before_sharding) before_sharding(*sharded.model);
  block_options.mesh = mesh;
  root_options.mesh = mesh;
  root_options.mp_policy = block_options.mp_policy;
  for (const auto& block : sharded.model->blocks()) sharded.blocks.push_back(fully_shard(*block, block_options));
  sharded.root = fully_shard(*sharded.model, root_options);
  sharded.model->to_empty(kCPU);
  sharded.model->reset_parameters(5);
  return sharded;
}

// [2, 8] tokens that differ per rank.
inline Tensor rank_tokens(int rank) {
  std::vector<int64_t> tokens(2 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 3) % 97);
  return ops::from_vector(tokens, {2, 8});
}

// Forward and backward of the language-model loss (no optimizer step).
inline void train_step(nn::GPT& model, int rank) {
  const Tensor idx = rank_tokens(rank);
  autograd::backward(model.loss(idx, idx));
}

// The parameters in `module`'s own FSDP group: its parameters but those of
// the FSDP modules below it (ignored parameters aside).
inline std::vector<std::shared_ptr<nn::Parameter>> group_parameters(nn::Module& module) {
  std::set<const nn::Parameter*> below;
  for (nn::Module* inner : module.modules()) {
    if (inner == &module || !fsdp_module(*inner)) continue;
    for (const auto& param : inner->parameters()) below.insert(param.get());
  }
  std::vector<std::shared_ptr<nn::Parameter>> own;
  for (const auto& param : module.parameters()) {
    if (below.count(param.get()) == 0) own.push_back(param);
  }
  return own;
}

// Elements of one rank's slot of a flat buffer holding `params` over `world`
// ranks: every parameter's chunk of ceil(rows / world) rows.
inline int64_t slot_numel(const std::vector<std::shared_ptr<nn::Parameter>>& params, int64_t world) {
  int64_t numel = 0;
  for (const auto& param : params) {
    const Shape& shape = param->global_shape();
    int64_t row = 1;
    for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
    numel += (shape[0] + world - 1) / world * row;
  }
  return numel;
}

// True when every parameter of `params` holds its shard (not the unsharded tensor).
inline bool holds_shards(const std::vector<std::shared_ptr<nn::Parameter>>& params) {
  for (const auto& param : params) {
    if (!param->is_sharded()) return false;
  }
  return true;
}

}  // namespace tessera::fsdp::testing
