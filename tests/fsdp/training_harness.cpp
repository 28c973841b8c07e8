// The harness behind the equivalence tests.
#include "tests/fsdp/training_harness.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "fsdp/naive_fsdp.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "nn/optim/sgd.h"
#include "tensor/ops.h"

namespace tessera::fsdp::testing {

namespace {

// The recipe's model as child "model", plus, on request, a Linear that
// forward never calls (its parameters get no gradient).
class HarnessModel : public nn::Module {
 public:
  HarnessModel(const ModelRecipe& recipe, DType dtype, bool unused) : Module("HarnessModel") {
    model_ = register_module("model", recipe.build_on_meta(dtype));
    if (unused) {
      register_module("unused", std::make_shared<nn::Linear>(4, 5, nn::LinearOptions{.device = kMeta, .dtype = dtype}));
    }
  }
  Tensor forward_inputs(const nn::TensorList& inputs) override { return (*model_)(inputs); }
  nn::Module& model() { return *model_; }

 private:
  std::shared_ptr<nn::Module> model_;
};

// The MLP recipe's model: logits = mlp(features), loss = cross_entropy.
class Classifier : public nn::Module {
 public:
  Classifier(int64_t features, int64_t hidden, int64_t classes, DType dtype) : Module("Classifier") {
    mlp_ = register_module("mlp", std::make_shared<nn::MLP>(features, hidden, classes, std::make_shared<nn::ReLU>(),
                                                            nn::MLPOptions{.device = kMeta, .dtype = dtype}));
  }
  // {features [N, in], labels [N]} -> mean loss
  Tensor forward_inputs(const nn::TensorList& inputs) override {
    return tessera::cross_entropy((*mlp_)(inputs.at(0)), inputs.at(1));
  }
  nn::MLP& mlp() { return *mlp_; }

 private:
  std::shared_ptr<nn::MLP> mlp_;
};

std::pair<Tensor, Tensor> token_sequences(std::mt19937_64& generator, int64_t vocab_size, int64_t batch,
                                          int64_t seq_len) {
  std::uniform_int_distribution<int64_t> token(0, vocab_size - 1);
  std::vector<int64_t> inputs, targets;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> sequence(static_cast<size_t>(seq_len + 1));
    for (auto& value : sequence) value = token(generator);
    inputs.insert(inputs.end(), sequence.begin(), sequence.end() - 1);
    targets.insert(targets.end(), sequence.begin() + 1, sequence.end());
  }
  return {ops::from_vector(inputs, {batch, seq_len}), ops::from_vector(targets, {batch, seq_len})};
}

std::vector<nn::Module*> causal_lm_blocks(nn::Module& model) {
  std::vector<nn::Module*> blocks;
  for (const auto& block : dynamic_cast<nn::CausalLM&>(model).blocks()) blocks.push_back(block.get());
  return blocks;
}

// A decoder of type Model built from `config` in the run's dtype, on token sequences.
template <typename Model, typename Config>
ModelRecipe causal_lm_recipe(std::string name, Config config) {
  return {.name = std::move(name),
          // Every rank thread calls this: it copies the config, never writes the captured one.
          .build_on_meta = [config](DType dtype) {
            Config in_dtype = config;
            in_dtype.dtype = dtype;
            return std::make_shared<Model>(in_dtype, kMeta);
          },
          .shard_units = causal_lm_blocks,
          .micro_batch = [vocab = config.vocab_size](std::mt19937_64& generator, int64_t batch, int64_t seq_len) {
            return token_sequences(generator, vocab, batch, seq_len);
          }};
}

struct MicroBatch {
  Tensor inputs, targets;
};

MicroBatch micro_batch(const TrainingSetup& setup, int64_t step, int64_t index) {
  std::mt19937_64 generator(setup.seed * 1000003ULL + static_cast<uint64_t>(step) * 4099ULL + static_cast<uint64_t>(index));
  auto [inputs, targets] = setup.model.micro_batch(generator, setup.batch, setup.seq_len);
  return {std::move(inputs), std::move(targets)};
}

std::unique_ptr<HarnessModel> build_meta(const TrainingSetup& setup) {
  return std::make_unique<HarnessModel>(setup.model, setup.dtype, setup.unused_parameters);
}

std::unique_ptr<optim::Optimizer> build_optimizer(const std::vector<nn::NamedParameter>& parameters,
                                                  const TrainingSetup& setup) {
  auto groups = optim::weight_decay_groups(parameters, 0.1);
  if (setup.optimizer == OptimizerKind::sgd) {
    return std::make_unique<optim::SGD>(std::move(groups), optim::SGDOptions{.lr = setup.lr, .weight_decay = 0.1});
  }
  return std::make_unique<optim::AdamW>(std::move(groups),
                                        optim::AdamWOptions{.lr = setup.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
}

// Divides every gradient by the number of micro-batches (sum -> mean), clips, steps.
double finish_step(HarnessModel& model, optim::Optimizer& optimizer, const TrainingSetup& setup, int64_t divisor) {
  if (divisor > 1) {
    for (auto& param : model.parameters()) {
      Tensor& tensor = param->tensor();
      if (tensor.grad().defined()) tensor.set_grad(ops::div(tensor.grad(), static_cast<double>(divisor)));
    }
  }
  const double norm = optim::clip_grad_norm_(model.parameters(), setup.clip > 0 ? setup.clip : INFINITY);
  optimizer.step();
  return norm;
}

// Forward and backward of micro-batch `index` of `step`; returns its loss.
double forward_backward(HarnessModel& model, const TrainingSetup& setup, int64_t step, int64_t index) {
  const MicroBatch batch = micro_batch(setup, step, index);
  Tensor loss = model({batch.inputs, batch.targets});
  autograd::backward(loss);
  return loss.item();
}

}  // namespace

TrainingResult train_unsharded(const TrainingSetup& setup, int64_t micro_batches) {
  const IntraOpThreads threads(setup.threads);
  auto model = build_meta(setup);
  model->to_empty(kCPU);
  model->reset_parameters(setup.seed);
  auto optimizer = build_optimizer(model->named_parameters(), setup);
  TrainingResult result;
  for (int64_t step = 0; step < setup.steps; ++step) {
    optimizer->zero_grad();
    double loss_sum = 0.0;
    for (int64_t index = 0; index < micro_batches; ++index) loss_sum += forward_backward(*model, setup, step, index);
    result.grad_norms.push_back(finish_step(*model, *optimizer, setup, micro_batches));
    result.losses.push_back(loss_sum / static_cast<double>(micro_batches));
  }
  for (const auto& [name, param] : model->named_parameters()) result.parameters[name] = param->tensor().to_vector<double>();
  return result;
}

TrainingResult train_fsdp_on(const dist::ProcessGroupPtr& world, const TrainingSetup& setup,
                             const ShardingSetup& sharding) {
  REQUIRE(world->size() % sharding.replicate == 0);
  const IntraOpThreads threads(setup.threads);
  const int shards = world->size() / sharding.replicate;
  const dist::DeviceMesh mesh = sharding.replicate > 1
                                    ? dist::DeviceMesh(world, kCPU, {sharding.replicate, shards}, {"replicate", "shard"})
                                    : dist::DeviceMesh(world, kCPU, {shards}, {"shard"});
  auto model = build_meta(setup);
  const std::vector<nn::Module*> units = setup.model.shard_units(model->model());
  for (size_t index = 0; index < units.size(); ++index) {
    units[index]->set_activation_checkpointing(
        sharding.activation_checkpointing.checkpoints(static_cast<int64_t>(index)));
  }
  for (nn::Module* unit : units) {
    fully_shard(*unit, {.mesh = mesh, .reshard_after_forward = sharding.reshard_after_forward,
                         .mp_policy = sharding.mp_policy});
  }
  FSDPModule root = fully_shard(*model, {.mesh = mesh, .mp_policy = sharding.mp_policy});
  model->to_empty(kCPU);
  model->reset_parameters(setup.seed);
  auto optimizer = build_optimizer(model->named_parameters(), setup);
  if (setup.after_weights_change) setup.after_weights_change(*model);

  TrainingResult result;
  for (int64_t step = 0; step < setup.steps; ++step) {
    optimizer->zero_grad();
    double loss_sum = 0.0;
    for (int64_t accumulation = 0; accumulation < setup.grad_accum; ++accumulation) {
      const bool last = accumulation + 1 == setup.grad_accum;
      root.set_requires_gradient_sync(last || sharding.sync_every_micro_batch);
      loss_sum += forward_backward(*model, setup, step, accumulation * world->size() + world->rank());
    }
    result.grad_norms.push_back(finish_step(*model, *optimizer, setup, setup.grad_accum));
    if (setup.after_weights_change) setup.after_weights_change(*model);
    Tensor total = ops::scalar_tensor(loss_sum, {.dtype = DType::f64});
    world->all_reduce(total, dist::ReduceOp::sum);
    result.losses.push_back(total.item() / static_cast<double>(world->size() * setup.grad_accum));
  }
  result.fsdp_communication = root.communication_stats();
  for (const auto& [name, param] : model->named_parameters()) {
    const Tensor full = param->is_sharded() ? param->dtensor().full_tensor() : param->tensor();
    result.parameters[name] = full.to_vector<double>();
  }
  return result;
}

TrainingResult train_fsdp(const TrainingSetup& setup, const ShardingSetup& sharding) {
  TrainingResult result;
  dist::LocalOptions options;
  options.group.deterministic = sharding.deterministic;
  dist::run_local(sharding.world, [&](const dist::ProcessGroupPtr& world) {
    TrainingResult local = train_fsdp_on(world, setup, sharding);
    if (world->rank() == 0) result = std::move(local);
  }, options);
  return result;
}

TrainingResult train_naive_fsdp(const TrainingSetup& setup, int world_size, bool deterministic) {
  REQUIRE(setup.grad_accum == 1);
  REQUIRE(setup.clip == 0.0);
  TrainingResult result;
  dist::LocalOptions options;
  options.group.deterministic = deterministic;
  dist::run_local(world_size, [&](const dist::ProcessGroupPtr& world) {
    const IntraOpThreads threads(setup.threads);
    auto model = build_meta(setup);
    model->to_empty(kCPU);
    model->reset_parameters(setup.seed);  // whole, on every rank
    NaiveFSDP fsdp(*model, world);
    auto optimizer = build_optimizer(fsdp.shards(), setup);
    TrainingResult local;
    for (int64_t step = 0; step < setup.steps; ++step) {
      optimizer->zero_grad();
      fsdp.gather();
      Tensor loss = ops::scalar_tensor(forward_backward(*model, setup, step, world->rank()), {.dtype = DType::f64});
      fsdp.reduce_scatter_gradients();
      // The global gradient norm: squares summed over the shards, then over the ranks.
      Tensor squares = ops::scalar_tensor(0.0, {.dtype = DType::f64});
      for (const auto& [name, shard] : fsdp.shards()) {
        if (shard->grad().defined()) squares = ops::add(squares, ops::sum(ops::mul(ops::to(shard->grad(), DType::f64), ops::to(shard->grad(), DType::f64))));
      }
      world->all_reduce(squares, dist::ReduceOp::sum);
      local.grad_norms.push_back(std::sqrt(squares.item()));
      optimizer->step();
      world->all_reduce(loss, dist::ReduceOp::sum);
      local.losses.push_back(loss.item() / static_cast<double>(world->size()));
    }
    fsdp.gather();
    for (const auto& [name, param] : model->named_parameters()) local.parameters[name] = param->tensor().to_vector<double>();
    if (world->rank() == 0) result = std::move(local);
  }, options);
  return result;
}

ModelRecipe gpt_recipe(nn::GPTConfig config) { return causal_lm_recipe<nn::GPT>("GPT", config); }

ModelRecipe llama_recipe(nn::LlamaConfig config) { return causal_lm_recipe<nn::Llama>("Llama", config); }

ModelRecipe mlp_recipe(int64_t features, int64_t hidden, int64_t classes) {
  return {.name = "MLP",
          .build_on_meta = [=](DType dtype) { return std::make_shared<Classifier>(features, hidden, classes, dtype); },
          .shard_units =
              [](nn::Module& model) {
                nn::MLP& mlp = dynamic_cast<Classifier&>(model).mlp();
                return std::vector<nn::Module*>{&mlp.fc(), &mlp.proj()};
              },
          .micro_batch =
              [=](std::mt19937_64& generator, int64_t batch, int64_t seq_len) {
                const int64_t rows = batch * seq_len;
                std::normal_distribution<double> feature;
                std::uniform_int_distribution<int64_t> label(0, classes - 1);
                std::vector<double> inputs(static_cast<size_t>(rows * features));
                for (double& value : inputs) value = feature(generator);
                std::vector<int64_t> targets(static_cast<size_t>(rows));
                for (int64_t& value : targets) value = label(generator);
                return std::pair{ops::from_vector(inputs, {rows, features}), ops::from_vector(targets, {rows})};
              }};
}

void apply_qlora(nn::Module& model, const std::string& blocks_prefix, uint64_t seed) {
  for (const auto& [name, parameter] : model.named_parameters()) parameter->set_requires_grad(false);
  for (const auto& [name, module] : model.named_modules()) {
    auto* linear = dynamic_cast<nn::Linear*>(module);
    if (linear == nullptr || !name.starts_with(blocks_prefix)) continue;
    linear->quantize_nf4();
    linear->add_lora({.rank = 2, .alpha = 4.0}, nn::InitContext{seed, name});
  }
}

TrainingSetup in_f64(TrainingSetup setup) {
  setup.dtype = DType::f64;
  return setup;
}

TrainingSetup with_sgd(TrainingSetup setup) {
  setup.optimizer = OptimizerKind::sgd;
  return setup;
}

void check_close(const TrainingResult& expected, const TrainingResult& actual, const Tolerance& tolerance) {
  REQUIRE(actual.losses.size() == expected.losses.size());
  REQUIRE(actual.grad_norms.size() == expected.grad_norms.size());
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    INFO("step " << step + 1 << ": loss " << actual.losses[step] << " vs unsharded " << expected.losses[step]
                 << ", gradient norm " << actual.grad_norms[step] << " vs " << expected.grad_norms[step]);
    CHECK(std::abs(actual.losses[step] - expected.losses[step]) <= tolerance.loss_rtol * std::abs(expected.losses[step]));
    CHECK(std::abs(actual.grad_norms[step] - expected.grad_norms[step]) <=
          tolerance.norm_rtol * std::abs(expected.grad_norms[step]));
  }
  REQUIRE(actual.parameters.size() == expected.parameters.size());
  for (const auto& [name, values] : expected.parameters) {
    REQUIRE(actual.parameters.count(name) == 1);
    const auto& got = actual.parameters.at(name);
    REQUIRE(got.size() == values.size());
    double worst = 0.0;
    size_t worst_index = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const double excess =
          std::abs(got[i] - values[i]) - (tolerance.param_atol + tolerance.param_rtol * std::abs(values[i]));
      if (excess > worst) worst = excess, worst_index = i;
    }
    INFO("parameter " << name << " element " << worst_index << ": " << got[worst_index] << " vs unsharded "
                      << values[worst_index]);
    CHECK(worst == 0.0);
  }
}

void check_bitwise(const TrainingResult& expected, const TrainingResult& actual) {
  REQUIRE(actual.losses.size() == expected.losses.size());
  REQUIRE(actual.grad_norms.size() == expected.grad_norms.size());
  REQUIRE(actual.parameters.size() == expected.parameters.size());
  int64_t elements = 0;
  for (const auto& [name, values] : expected.parameters) elements += static_cast<int64_t>(values.size());
  const double norm_rtol = reassociated_norm_rtol(elements);
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    INFO("step " << step + 1 << ": loss " << actual.losses[step] << " vs unsharded " << expected.losses[step]
                 << ", gradient norm " << actual.grad_norms[step] << " vs " << expected.grad_norms[step]);
    CHECK(actual.losses[step] == expected.losses[step]);
    CHECK(std::abs(actual.grad_norms[step] - expected.grad_norms[step]) <= norm_rtol * expected.grad_norms[step]);
  }
  for (const auto& [name, values] : expected.parameters) {
    INFO("parameter " << name);
    REQUIRE(actual.parameters.count(name) == 1);
    CHECK(actual.parameters.at(name) == values);
  }
}

}  // namespace tessera::fsdp::testing
