// The models, meshes and data of the tensor-parallel x FSDP tests, shared by
// the thread-rank suite (test_tp_with_fsdp.cpp) and the mpirun one
// (test_tp_mpi.cpp): a small GPT and Llama with uneven shares, a (dp, tp) or
// (replicate, dp, tp) mesh with FSDP's mesh over the ranks holding the same
// piece, each data rank's rows of a global batch, and whole tensors gathered
// from pieces.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "tensor/ops.h"
#include "tp/plans.h"

namespace tessera::tp::testing {

namespace ops = tessera::ops;

// Thread ranks for the tp suites: a collective that waits a minute has hung.
inline dist::LocalOptions thread_rank_options() {
  dist::LocalOptions options;
  options.group.timeout = std::chrono::seconds(60);
  return options;
}

constexpr uint64_t kComposedSeed = 4321;
constexpr int64_t kRowsPerDpRank = 2;
constexpr int64_t kComposedSequence = 8;

inline nn::GPTConfig composed_gpt() {
  nn::GPTConfig config;
  config.vocab_size = 61;  // 31/30 over tp 2
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = 24;
  return config;
}

inline nn::LlamaConfig composed_llama() {
  nn::LlamaConfig config;
  config.vocab_size = 61;
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.n_embd = 24;
  config.ffn_hidden = 37;  // uneven over tp 2 (19/18), then over dp
  return config;
}

using ComposedFactory = std::function<std::shared_ptr<nn::CausalLM>(Device)>;

inline std::vector<std::pair<std::string, ComposedFactory>> composed_models() {
  return {{"GPT", [](Device device) { return std::make_shared<nn::GPT>(composed_gpt(), device); }},
          {"Llama", [](Device device) { return std::make_shared<nn::Llama>(composed_llama(), device); }}};
}

// Tokens of the global batch: [dp * kRowsPerDpRank, T].
inline Tensor global_tokens(int64_t dp, uint64_t salt) {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < dp * kRowsPerDpRank * kComposedSequence; ++i) {
    values.push_back(static_cast<int64_t>((static_cast<uint64_t>(i) * 40503ULL + salt * 7919ULL) % 61));
  }
  return ops::from_vector(values, {dp * kRowsPerDpRank, kComposedSequence});
}

inline Tensor rows_of_dp_rank(const Tensor& global, int64_t dp_rank) {
  return ops::contiguous(ops::narrow(global, 0, dp_rank * kRowsPerDpRank, kRowsPerDpRank));
}

// Values that are not round, from a salt: the order of their sums shows in
// the last bits.
inline Tensor irregular_tensor(Shape shape, uint64_t salt) {
  std::vector<float> values;
  for (int64_t i = 0; i < shape_numel(shape); ++i) {
    const uint64_t h = (static_cast<uint64_t>(i) + 1) * 2654435761ULL + salt * 40503ULL;
    values.push_back(static_cast<float>(static_cast<double>(h % 20011) / 20011.0 - 0.5) * 0.731f);
  }
  return ops::from_vector(values, shape);
}

// Whether two f32 tensors hold the same bits.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() &&
         ops::contiguous(a.detach()).to_vector<float>() == ops::contiguous(b.detach()).to_vector<float>();
}

inline std::vector<double> doubles(const Tensor& tensor) {
  return ops::to(tensor.detach(), DType::f64).to_vector<double>();
}

inline double worst_difference(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = doubles(got);
  const std::vector<double> b = doubles(want);
  TESSERA_CHECK(a.size() == b.size(), "worst_difference: {} against {} elements", a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

inline double largest_magnitude(const Tensor& tensor) {
  double largest = 0.0;
  for (double value : doubles(tensor)) largest = std::max(largest, std::abs(value));
  return largest;
}

// A parameter's tensor or gradient whole: gathered over FSDP's mesh (to the
// tp piece), then over tp.
inline Tensor gathered(const nn::Parameter& parameter, const Tensor& local) {
  Tensor piece = local.detach();
  if (const auto& sharding = parameter.sharding()) {
    piece = dist::DTensor(ops::contiguous(piece), sharding->mesh, sharding->placements, sharding->global_shape)
                .full_tensor();
  }
  const auto& tensor_parallel = parameter.tensor_parallel();
  return tensor_parallel ? tp::full_tensor(piece, *tensor_parallel) : ops::clone(piece);
}

struct ComposedMesh {
  dist::DeviceMesh mesh;
  dist::DeviceMesh tp;
  dist::DeviceMesh fsdp;  // mesh["dp"], or (replicate, dp) for HSDP
  int64_t dp_rank;        // which rows of the global batch this rank reads
};

inline ComposedMesh composed_mesh(const dist::ProcessGroupPtr& world, int64_t replicate, int64_t dp, int64_t tp) {
  if (replicate == 1) {
    dist::DeviceMesh mesh(world, kCPU, {dp, tp}, {"dp", "tp"});
    return {mesh, mesh["tp"], mesh["dp"], mesh.coordinate(0)};
  }
  dist::DeviceMesh mesh(world, kCPU, {replicate, dp, tp}, {"replicate", "dp", "tp"});
  // HSDP over the first two dims: a 2-D (replicate, dp) mesh of the ranks
  // that share this rank's tp coordinate (ranks are laid out row-major).
  std::vector<int> same_piece;
  for (int64_t r = 0; r < replicate; ++r) {
    for (int64_t d = 0; d < dp; ++d) same_piece.push_back(static_cast<int>((r * dp + d) * tp + mesh.coordinate(2)));
  }
  dist::DeviceMesh hsdp(world->split(same_piece, "hsdp"), kCPU, {replicate, dp}, {"replicate", "dp"});
  return {mesh, mesh["tp"], hsdp, mesh.coordinate(0) * dp + mesh.coordinate(1)};
}

inline std::shared_ptr<nn::CausalLM> composed_model(const ComposedFactory& make, const ComposedMesh& meshes) {
  auto model = make(kMeta);
  tp::parallelize_causal_lm(*model, meshes.tp);
  for (auto& block : model->blocks()) fsdp::fully_shard(*block, {.mesh = meshes.fsdp});
  fsdp::fully_shard(*model, {.mesh = meshes.fsdp});
  model->to_empty(kCPU);
  model->reset_parameters(kComposedSeed);
  return model;
}

// AdamW for comparing runs: eps well above the rounding noise of gradients
// that are 0 in exact arithmetic (a key bias's), which AdamW's first step
// would turn into steps of +-lr.
inline const optim::AdamWOptions kComparableAdamW{.lr = 1e-2, .eps = 1e-3};

// One rank's step, what the parallel runs are held to: the loss, every
// gradient, the gradient norm, and the parameters after one AdamW step.
struct ReferenceStep {
  Tensor loss;
  std::map<std::string, Tensor> gradients;
  double norm = 0.0;
  nn::StateDict after;
};

inline ReferenceStep reference_step(nn::CausalLM& model, const Tensor& idx, const Tensor& targets) {
  ReferenceStep step;
  step.loss = model.loss(idx, targets);
  autograd::backward(step.loss);
  for (const auto& [name, parameter] : model.named_parameters()) step.gradients[name] = ops::clone(parameter->grad());
  step.norm = optim::clip_grad_norm_(model.parameters(), 1e9);
  optim::AdamW optimizer(model.named_parameters(), kComparableAdamW);
  optimizer.step();
  for (const auto& [name, tensor] : model.state_dict()) step.after[name] = ops::clone(tensor);
  return step;
}

}  // namespace tessera::tp::testing
