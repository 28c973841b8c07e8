// Activation checkpointing: training with it is training without it, bit for
// bit (dropout included); each checkpointed block runs its forward once more
// in backward; after forward a checkpointed block holds exactly its input,
// and a selective one its input and its products; the selective replay
// takes the forward's products instead of computing them; finite-difference
// checks through the recompute; the policies; the refusals.
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
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/transformer_block.h"
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
  SUBCASE("selective") {
    const TrainedRun selective = train_checkpointed(build(), ActivationCheckpointPolicy::parse("selective"));
    check_same_training(reference, selective);
    CHECK(selective.block_forwards == 2 * 3 * 3);
  }
}

TEST_CASE("the selective replay takes the forward's products, where full checkpointing computes them again") {
  const auto qkv_outputs = [](const char* policy) {
    manual_seed(18);
    nn::GPT model(checkpoint_gpt_config());
    nn::apply_activation_checkpointing(model.blocks(), ActivationCheckpointPolicy::parse(policy));
    std::vector<const void*> storages;  // qkv's output, in forward then in the replay
    model.block(1).attn().qkv().register_forward_hook([&](nn::Module&, const nn::TensorList&, const Tensor& out) {
      storages.push_back(out.storage().get());
      return std::optional<Tensor>();
    });
    const auto [idx, targets] = checkpoint_batch(2, 8, 256);
    autograd::backward(model.loss(idx, targets));
    return storages;
  };
  const std::vector<const void*> selective = qkv_outputs("selective"), full = qkv_outputs("full");
  REQUIRE(selective.size() == 2);
  REQUIRE(full.size() == 2);
  CHECK(selective[0] == selective[1]);
  CHECK(full[0] != full[1]);
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
  const TrainedRun selective = train_checkpointed(build(), ActivationCheckpointPolicy::parse("selective"));
  check_same_training(reference, selective);
  CHECK(selective.block_forwards == 2 * reference.block_forwards);
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
  // Selective: also qkv (3C), attention's output (C) and log-sum-exp (one
  // f32 a head), attention's projection (C) and the MLP's second product (C).
  const int64_t heads = checkpoint_gpt_config().n_head;
  const int64_t selective_per_block = (live_after_forward(3, "selective") - live_after_forward(1, "selective")) / 2;
  MESSAGE("selective: ", selective_per_block);
  CHECK(selective_per_block == 7 * block_input_bytes + B * T * heads * 4);
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

TEST_CASE("finite differences through a selective replay: a fused GELU MLP with dropout, and attention") {
  manual_seed(19);
  auto mlp = std::make_shared<nn::MLP>(4, 8, 4, std::make_shared<nn::GELU>(),
                                       nn::MLPOptions{.dropout = 0.3, .dtype = DType::f64});
  mlp->set_activation_checkpointing(nn::Checkpointing::selective);
  Tensor x = ops::randn({3, 4}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  const Tensor fc_weight = mlp->fc().weight().tensor();
  const Tensor proj_weight = mlp->proj().weight().tensor();
  const auto f = [&](const nn::TensorList& inputs) {
    manual_seed(20);
    return (*mlp)(inputs[0]);
  };
  const autograd::GradcheckResult result = autograd::gradcheck(f, {x, fc_weight, proj_weight});
  CHECK_MESSAGE(result.ok, result.report);
  const auto gradients = [&](nn::Checkpointing mode) {
    mlp->set_activation_checkpointing(mode);
    return autograd::grad({tessera::sum(f({x}))}, {x, fc_weight, proj_weight});
  };
  const nn::TensorList with = gradients(nn::Checkpointing::selective), without = gradients(nn::Checkpointing::off);
  for (size_t i = 0; i < with.size(); ++i) CHECK(checkpoint_values(with[i]) == checkpoint_values(without[i]));

  auto block = std::make_shared<nn::TransformerBlock>(8, 2, nn::TransformerBlockOptions{.dtype = DType::f64});
  block->set_activation_checkpointing(nn::Checkpointing::selective);
  Tensor tokens = ops::randn({1, 3, 8}, {.dtype = DType::f64});
  tokens.set_requires_grad(true);
  const autograd::GradcheckResult through_attention =
      autograd::gradcheck([&](const nn::TensorList& inputs) { return (*block)(inputs[0]); }, {tokens});
  CHECK_MESSAGE(through_attention.ok, through_attention.report);
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
  const ActivationCheckpointPolicy selective = ActivationCheckpointPolicy::parse("selective");
  CHECK(selective.str() == "selective");
  CHECK(selective.checkpoints(4));
  CHECK(selective.mode_of(4) == nn::Checkpointing::selective);
  CHECK(every3.mode_of(2) == nn::Checkpointing::full);
  CHECK(every3.mode_of(1) == nn::Checkpointing::off);
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
  CHECK(nn::apply_activation_checkpointing(model.blocks(), selective) == 3);
  CHECK(model.block(0).activation_checkpointing_mode() == nn::Checkpointing::selective);
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

namespace {

// A forward whose products depend on a knob that backward may find changed:
// `rows` rows of x through the first weight, then the second weight if `twice`.
class KnobbedProducts : public nn::Module {
 public:
  KnobbedProducts() : nn::Module("KnobbedProducts") {
    register_parameter("first", std::make_shared<nn::Parameter>(ops::randn({4, 4})));
    register_parameter("second", std::make_shared<nn::Parameter>(ops::randn({4, 4})));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = tessera::linear(tessera::narrow(x, 0, 0, rows), parameter("first")->tensor(), Tensor());
    if (twice) y = tessera::linear(y, parameter("second")->tensor(), Tensor());
    return tessera::sum(y);
  }
  int64_t rows = 2;
  bool twice = true;
};

}  // namespace

TEST_CASE("refusals: a selective replay that calls other products than its forward") {
  manual_seed(21);
  const Tensor x = ops::randn({3, 4});
  KnobbedProducts module;
  module.set_activation_checkpointing(nn::Checkpointing::selective);
  SUBCASE("on other shapes") {
    const Tensor loss = module(x);
    module.rows = 1;
    CHECK_THROWS_WITH_AS(autograd::backward(loss),
                         doctest::Contains("memoized op 1 is linear([1, 4], [4, 4], []), but the forward's was "
                                           "linear([2, 4], [4, 4], [])"),
                         tessera::Error);
  }
  SUBCASE("fewer") {
    const Tensor loss = module(x);
    module.twice = false;
    CHECK_THROWS_WITH_AS(autograd::backward(loss),
                         doctest::Contains("KnobbedProducts's recompute called 1 memoized ops, but its forward called 2"),
                         tessera::Error);
  }
  SUBCASE("more") {
    module.twice = false;
    const Tensor loss = module(x);
    module.twice = true;
    CHECK_THROWS_WITH_AS(autograd::backward(loss), doctest::Contains("but the forward called only 1 memoized ops"),
                         tessera::Error);
  }
}

}  // TEST_SUITE
