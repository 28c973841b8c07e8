// Activation checkpointing: training with it is training without it, bit for
// bit (dropout included); each checkpointed block runs its forward once more
// in backward; after forward a checkpointed block holds exactly its input;
// a finite-difference check through the recompute; the policies; the
// refusals.
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "nn/activation.h"
#include "nn/activation_checkpoint.h"
#include "nn/mlp.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/optim/adamw.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace tessera;
using nn::ActivationCheckpointPolicy;

namespace {

std::pair<Tensor, Tensor> checkpoint_batch(int64_t B, int64_t T, int64_t vocab) {
  std::vector<int64_t> idx, targets;
  for (int64_t i = 0; i < B * T; ++i) {
    idx.push_back((i * 29 + 7) % vocab);
    targets.push_back((i * 13 + 3) % vocab);
  }
  return {ops::from_vector(idx, {B, T}), ops::from_vector(targets, {B, T})};
}

std::vector<double> checkpoint_values(const Tensor& t) { return ops::to(t.detach(), DType::f64).to_vector<double>(); }

struct TrainedRun {
  std::unique_ptr<nn::CausalLM> model;
  std::vector<double> losses;
  uint64_t generator_after = 0;
  int block_forwards = 0;  // forwards of the blocks' first children (a recompute counts again)
};

// Three AdamW steps of `model` on one batch, checkpointed by `policy`.
TrainedRun train_checkpointed(std::unique_ptr<nn::CausalLM> model, const ActivationCheckpointPolicy& policy) {
  TrainedRun run;
  nn::apply_activation_checkpointing(model->blocks(), policy);
  for (const auto& block : model->blocks()) {
    block->children().front()->register_forward_hook([&run](nn::Module&, const nn::TensorList&, const Tensor&) {
      ++run.block_forwards;
      return std::optional<Tensor>();
    });
  }
  const auto [idx, targets] = checkpoint_batch(2, 16, 256);
  optim::AdamW optimizer(model->named_parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    const Tensor loss = model->loss(idx, targets);
    run.losses.push_back(loss.item());
    autograd::backward(loss);
    optimizer.step();
  }
  run.generator_after = default_generator().next_stream();
  run.model = std::move(model);
  return run;
}

void check_same_training(const TrainedRun& reference, const TrainedRun& checkpointed) {
  CHECK(checkpointed.losses == reference.losses);
  CHECK(checkpointed.generator_after == reference.generator_after);
  const auto expected = reference.model->named_parameters(), got = checkpointed.model->named_parameters();
  REQUIRE(expected.size() == got.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(checkpoint_values(got[i].second->tensor()) == checkpoint_values(expected[i].second->tensor()));
  }
}

nn::GPTConfig checkpoint_gpt_config() {
  nn::GPTConfig config = nn::GPTConfig::preset("tiny");
  config.n_layer = 3;
  config.dropout = 0.1;
  return config;
}

}  // namespace

TEST_SUITE("activation checkpointing") {

TEST_CASE("GPT with dropout trains bit for bit as without checkpointing, each recompute one forward more") {
  const nn::GPTConfig config = checkpoint_gpt_config();
  const auto build = [&] {
    manual_seed(11);
    return std::unique_ptr<nn::CausalLM>(std::make_unique<nn::GPT>(config));
  };
  const TrainedRun reference = train_checkpointed(build(), {});
  CHECK(reference.block_forwards == 3 * 3);
  SUBCASE("full") {
    const TrainedRun full = train_checkpointed(build(), ActivationCheckpointPolicy::parse("full"));
    check_same_training(reference, full);
    CHECK(full.block_forwards == 2 * 3 * 3);
  }
  SUBCASE("every:2 (the second block)") {
    const TrainedRun every = train_checkpointed(build(), ActivationCheckpointPolicy::parse("every:2"));
    check_same_training(reference, every);
    CHECK(every.block_forwards == 3 * (3 + 1));
  }
}

TEST_CASE("Llama trains bit for bit as without checkpointing") {
  nn::LlamaConfig config = nn::LlamaConfig::preset("llama-nano");
  config.n_layer = 2;
  const auto build = [&] {
    manual_seed(12);
    return std::unique_ptr<nn::CausalLM>(std::make_unique<nn::Llama>(config));
  };
  const TrainedRun reference = train_checkpointed(build(), {});
  const TrainedRun full = train_checkpointed(build(), ActivationCheckpointPolicy::parse("full"));
  check_same_training(reference, full);
  CHECK(full.block_forwards == 2 * reference.block_forwards);
}

TEST_CASE("after forward a checkpointed block holds exactly its input: B T C elements") {
  const int64_t B = 2, T = 16;
  const auto live_after_forward = [&](int64_t layers, const char* policy) {
    nn::GPTConfig config = checkpoint_gpt_config();
    config.n_layer = layers;
    manual_seed(13);
    nn::GPT model(config);
    nn::apply_activation_checkpointing(model.blocks(), ActivationCheckpointPolicy::parse(policy));
    const auto [idx, targets] = checkpoint_batch(B, T, 256);
    auto counters = std::make_shared<MemoryCounters>();
    int64_t live = 0;
    {
      const MemoryScope scope(counters);
      const Tensor loss = model.loss(idx, targets);
      live = counters->snapshot().live_bytes;
      autograd::backward(loss);
    }
    return live;
  };
  const int64_t block_input_bytes = B * T * 64 * 4;  // f32 [B, T, C]
  const int64_t checkpointed_per_block = (live_after_forward(3, "full") - live_after_forward(1, "full")) / 2;
  const int64_t kept_per_block = (live_after_forward(3, "off") - live_after_forward(1, "off")) / 2;
  MESSAGE("activations a block keeps, tiny GPT at B 2 T 16: ", kept_per_block, " bytes; checkpointed: ",
          checkpointed_per_block);
  CHECK(checkpointed_per_block == block_input_bytes);
  CHECK(kept_per_block >= 10 * block_input_bytes);
}

TEST_CASE("finite differences through the recompute, dropout on (the replay draws the same masks)") {
  manual_seed(14);
  auto mlp = std::make_shared<nn::MLP>(4, 8, 4, std::make_shared<nn::GELU>(),
                                       nn::MLPOptions{.dropout = 0.3, .dtype = DType::f64});
  mlp->set_activation_checkpointing(true);
  Tensor x = ops::randn({3, 4}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  const Tensor fc_weight = mlp->fc().weight().tensor();
  const Tensor proj_bias = mlp->proj().bias().tensor();
  const auto f = [&](const nn::TensorList& inputs) {
    manual_seed(15);  // every evaluation draws the same dropout keys
    return (*mlp)(inputs[0]);
  };
  const autograd::GradcheckResult result = autograd::gradcheck(f, {x, fc_weight, proj_bias});
  CHECK_MESSAGE(result.ok, result.report);
  // And the same gradients as the module without checkpointing.
  const auto gradients = [&](bool checkpointed) {
    mlp->set_activation_checkpointing(checkpointed);
    return autograd::grad({tessera::sum(f({x}))}, {x, fc_weight});
  };
  const nn::TensorList with = gradients(true), without = gradients(false);
  CHECK(checkpoint_values(with[0]) == checkpoint_values(without[0]));
  CHECK(checkpoint_values(with[1]) == checkpoint_values(without[1]));
}

TEST_CASE("with recording off a checkpointed module records nothing and recomputes nothing") {
  manual_seed(16);
  nn::MLP mlp(4, 8, 4, std::make_shared<nn::GELU>());
  mlp.set_activation_checkpointing(true);
  int forwards = 0;
  mlp.fc().register_forward_hook([&](nn::Module&, const nn::TensorList&, const Tensor&) {
    ++forwards;
    return std::optional<Tensor>();
  });
  const autograd::NoGradGuard no_grad;
  const Tensor y = mlp(ops::randn({2, 4}));
  CHECK(y.grad_fn() == nullptr);
  CHECK_FALSE(y.requires_grad());
  CHECK(forwards == 1);
}

TEST_CASE("policies: parse, print and pick blocks as torchtitan counts them") {
  CHECK(ActivationCheckpointPolicy::parse("off").str() == "off");
  CHECK(ActivationCheckpointPolicy::parse("full").str() == "full");
  const ActivationCheckpointPolicy every3 = ActivationCheckpointPolicy::parse("every:3");
  CHECK(every3.str() == "every:3");
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < 7; ++i) {
    if (every3.checkpoints(i)) picked.push_back(i);
  }
  CHECK(picked == std::vector<int64_t>{2, 5});
  CHECK(ActivationCheckpointPolicy::parse("every:1").checkpoints(0));
  CHECK_FALSE(ActivationCheckpointPolicy::parse("off").checkpoints(0));
  for (const char* bad : {"", "on", "every", "every:", "every:0", "every:-2", "every:2x", "Full", "selective:x"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(ActivationCheckpointPolicy::parse(bad), doctest::Contains("is not a policy"),
                         tessera::Error);
  }
  nn::GPT model(checkpoint_gpt_config());
  CHECK(nn::apply_activation_checkpointing(model.blocks(), every3) == 1);
  CHECK(model.block(2).activation_checkpointing());
  CHECK_FALSE(model.block(0).activation_checkpointing());
  CHECK(nn::apply_activation_checkpointing(model.blocks(), {}) == 0);
  CHECK_FALSE(model.block(2).activation_checkpointing());
}

TEST_CASE("refusals: a module gone, switched to eval, or with other parameters by backward") {
  const auto checkpointed_mlp = [] {
    manual_seed(17);
    auto mlp = std::make_shared<nn::MLP>(4, 8, 4, std::make_shared<nn::GELU>());
    mlp->set_activation_checkpointing(true);
    return mlp;
  };
  const Tensor x = ops::randn({2, 4});
  SUBCASE("destroyed") {
    auto mlp = checkpointed_mlp();
    const Tensor loss = tessera::sum((*mlp)(x));
    mlp.reset();
    CHECK_THROWS_WITH_AS(autograd::backward(loss), doctest::Contains("was destroyed before backward"),
                         tessera::Error);
  }
  SUBCASE("eval at backward") {
    auto mlp = checkpointed_mlp();
    const Tensor loss = tessera::sum((*mlp)(x));
    mlp->eval();
    CHECK_THROWS_WITH_AS(autograd::backward(loss), doctest::Contains("ran forward in train mode but is in eval"),
                         tessera::Error);
  }
  SUBCASE("a parameter replaced") {
    auto mlp = checkpointed_mlp();
    const Tensor loss = tessera::sum((*mlp)(x));
    mlp->fc().set_parameter("weight", std::make_shared<nn::Parameter>(ops::zeros({8, 4})));
    CHECK_THROWS_WITH_AS(autograd::backward(loss), doctest::Contains("trainable parameters changed"),
                         tessera::Error);
  }
}

}  // TEST_SUITE
