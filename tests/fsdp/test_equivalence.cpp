// FSDP against unsharded training on the same global batch: a tiny GPT and an
// awkward one (vocabulary 97, width 72, 3 heads) on 1..8 ranks, every
// reshard_after_forward mode, HSDP, both gradient-accumulation modes, unused
// and tied parameters, clipping, bf16 parameters; a Llama (grouped-query
// attention, RoPE, untied head) and an MLP classifier on 1..5 ranks and HSDP;
// the naive reference against fully_shard on GPT and Llama.
//
// Each comparison is exact or provably within its tolerance on any machine:
// - Where FSDP does the unsharded arithmetic (each rank's micro-batch gradient
//   is the one the single process computes on as many intra-op threads, the
//   ranks' gradients are added in rank order and divided once, as the local
//   backend and deterministic mode always reduce): bitwise, in f32 with AdamW,
//   the configuration people run.
// - Where the order of the sums differs (HSDP adds per replica first,
//   accumulation per rank first, clipping's norm per shard first), the runs
//   part by rounding. f32 AdamW cannot be compared then: where a gradient is
//   near zero, AdamW divides its rounding noise by its own size and steps lr
//   in a random direction, and which elements do so depends on the machine's
//   summation order. These cases run twice instead, in f64 with AdamW and in
//   f32 with SGD (tolerances and why they hold: equivalence.h).
#include <algorithm>
#include <atomic>
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "dist/backends/local_backend.h"
#include "fsdp/float8_scales.h"
#include "fsdp/naive_fsdp.h"
#include "nn/linear.h"
#include "nn/models/gpt.h"
#include "tensor/error.h"
#include "tests/fsdp/training_harness.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

nn::GPTConfig tiny_gpt() {
  nn::GPTConfig config = nn::GPTConfig::preset("nano");
  config.block_size = 8;
  return config;
}

TrainingSetup tiny() { return {.model = gpt_recipe(tiny_gpt())}; }

// Without biases, where the tiny model has them: both layouts get sharded.
TrainingSetup awkward() {
  return {.model = gpt_recipe(
              {.vocab_size = 97, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 72, .bias = false})};
}

// 3 query heads sharing one kv head of width 8: wk and wv have 8 rows, so 5
// ranks hold 2, 2, 2, 2, 0; vocab 97 and F 40 are uneven too.
TrainingSetup llama() {
  return {.model = llama_recipe({.vocab_size = 97, .block_size = 8, .n_layer = 2, .n_head = 3, .n_kv_head = 1,
                                 .n_embd = 24, .ffn_hidden = 40})};
}

// 7 features, 13 hidden, 5 classes: every matrix shards unevenly.
TrainingSetup mlp() { return {.model = mlp_recipe(7, 13, 5)}; }

// The setup with `change` applied to its model as built, before sharding.
TrainingSetup with_model_change(TrainingSetup setup, const std::string& what,
                                const std::function<void(nn::Module&)>& change) {
  const ModelRecipe original = setup.model;
  setup.model.name += ", " + what;
  setup.model.build_on_meta = [original, change](DType dtype) {
    std::shared_ptr<nn::Module> model = original.build_on_meta(dtype);
    change(*model);
    return model;
  };
  return setup;
}

// For a case whose summation order differs from unsharded training's: f64
// AdamW and f32 SGD, each against its own unsharded run; returns those two.
std::vector<TrainingResult> check_across_orders(const TrainingSetup& setup, int64_t micro_batches,
                                                const ShardingSetup& sharding) {
  const TrainingSetup f64 = in_f64(setup), sgd = with_sgd(setup);
  std::vector<TrainingResult> unsharded = {train_unsharded(f64, micro_batches), train_unsharded(sgd, micro_batches)};
  {
    INFO("f64 AdamW");
    check_close(unsharded[0], train_fsdp(f64, sharding), kF64AdamW);
  }
  INFO("f32 SGD");
  check_close(unsharded[1], train_fsdp(sgd, sharding), kF32Sgd);
  return unsharded;
}

}  // namespace

TEST_CASE("fsdp: tiny GPT on 1, 2, 3, 4, 5, 8 ranks is bitwise unsharded training") {
  const TrainingSetup setup = tiny();
  for (int world : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(world);
    check_bitwise(train_unsharded(setup, world), train_fsdp(setup, {.world = world}));
  }
}

TEST_CASE("fsdp: an awkward GPT (vocab 97, width 72, 3 heads) with uneven and empty shards is bitwise unsharded") {
  // 97 rows on 8 ranks: chunks of 13, the last rank holds 6; wpe's 8 rows on 5
  // ranks leave rank 4 empty.
  const TrainingSetup setup = awkward();
  for (int world : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(world);
    check_bitwise(train_unsharded(setup, world), train_fsdp(setup, {.world = world}));
  }
}

TEST_CASE("fsdp: a Llama (GQA, RoPE, untied head) and an MLP on 1..5 ranks are bitwise unsharded training") {
  for (const TrainingSetup& setup : {llama(), mlp()}) {
    for (int world : {1, 2, 3, 4, 5}) {
      CAPTURE(setup.model.name);
      CAPTURE(world);
      check_bitwise(train_unsharded(setup, world), train_fsdp(setup, {.world = world}));
    }
  }
}

TEST_CASE("fsdp: the naive reference (one collective per parameter) is bitwise fully_shard, shards even, uneven, empty") {
  // awkward() on 5 ranks: wpe's 8 rows leave rank 4 no rows at all.
  for (const TrainingSetup& setup : {tiny(), awkward(), llama()}) {
    for (int world : {1, 2, 3, 5}) {
      CAPTURE(setup.model.name);
      CAPTURE(world);
      check_bitwise(train_fsdp(setup, {.world = world, .deterministic = true}),
                    train_naive_fsdp(setup, world, /*deterministic=*/true));
    }
  }
  // It shards values: a model still on meta is refused, naming the parameter.
  dist::run_local(1, [](const dist::ProcessGroupPtr& world) {
    nn::GPT model(tiny_gpt(), kMeta);
    CHECK_THROWS_WITH_AS(NaiveFSDP(model, world), doctest::Contains("parameter 'wte.weight' of shape"), Error);
  });
}

TEST_CASE("fsdp: activation checkpointing trains bitwise as without it, with not one collective more") {
  // The recompute runs inside each block's backward, after FSDP's pre-backward
  // all-gather: it reuses the gathered parameters. Dropout replays its masks.
  nn::GPTConfig gpt = tiny_gpt();
  gpt.n_layer = 3;
  gpt.dropout = 0.1;
  for (const TrainingSetup& setup : {TrainingSetup{.model = gpt_recipe(gpt), .steps = 4}, llama()}) {
    for (int world : {2, 3}) {
      const TrainingResult plain = train_fsdp(setup, {.world = world});
      for (const char* policy : {"full", "every:2", "selective"}) {
        CAPTURE(setup.model.name);
        CAPTURE(world);
        CAPTURE(policy);
        const TrainingResult checkpointed = train_fsdp(
            setup, {.world = world, .activation_checkpointing = nn::ActivationCheckpointPolicy::parse(policy)});
        check_bitwise(plain, checkpointed);
        using dist::CollectiveKind;
        for (const CollectiveKind kind : {CollectiveKind::all_gather, CollectiveKind::reduce_scatter}) {
          CAPTURE(dist::collective_name(kind));
          CHECK(checkpointed.fsdp_communication[kind].calls == plain.fsdp_communication[kind].calls);
          CHECK(checkpointed.fsdp_communication[kind].bytes_sent == plain.fsdp_communication[kind].bytes_sent);
        }
        CHECK(plain.fsdp_communication[dist::CollectiveKind::all_gather].calls > 0);
      }
    }
  }
}

TEST_CASE("fsdp: frozen parameters train as unsharded, bitwise, and stay as they were; 2 and 3 ranks") {
  const TrainingSetup setup = with_model_change(tiny(), "qkv and wpe frozen", [](nn::Module& model) {
    for (const auto& [name, parameter] : model.named_parameters()) {
      if (name.find("attn.qkv.") != std::string::npos || name == "wpe.weight") parameter->set_requires_grad(false);
    }
  });
  for (int world : {2, 3}) {
    CAPTURE(world);
    const TrainingResult expected = train_unsharded(setup, world);
    const TrainingResult sharded = train_fsdp(setup, {.world = world});
    check_bitwise(expected, sharded);
    TrainingSetup one_step = setup;
    one_step.steps = 1;
    const TrainingResult early = train_fsdp(one_step, {.world = world});
    int frozen = 0;
    for (const auto& [name, values] : sharded.parameters) {
      const bool is_frozen = name.find("attn.qkv.") != std::string::npos || name.ends_with("wpe.weight");
      CAPTURE(name);
      if (is_frozen) {
        CHECK(values == early.parameters.at(name));
        ++frozen;
      } else {
        CHECK(values != early.parameters.at(name));
      }
    }
    CHECK(frozen == 2 * tiny_gpt().n_layer + 1);
  }
}

TEST_CASE("fsdp: QLoRA (NF4 base, LoRA adapters) on 1, 2, 3 and 8 ranks is bitwise unsharded training") {
  // The Llama's projections packed in NF4 and frozen with rank-2 adapters,
  // every other parameter frozen: wk and wv have 8 rows (8 ranks hold one
  // each, 3 ranks 3, 3, 2), w2's rows are 40 wide (one partial NF4 block).
  TrainingSetup setup =
      with_model_change(llama(), "QLoRA rank 2", [](nn::Module& model) { apply_qlora(model, "layers.", 7); });
  setup.steps = 4;
  TrainingSetup one_step = setup;
  one_step.steps = 1;
  for (int world : {1, 2, 3, 8}) {
    CAPTURE(world);
    const TrainingResult expected = train_unsharded(setup, world);
    const TrainingResult sharded = train_fsdp(setup, {.world = world});
    check_bitwise(expected, sharded);
    const TrainingResult early = train_fsdp(one_step, {.world = world});
    int adapters = 0, packed = 0;
    for (const auto& [name, values] : sharded.parameters) {
      CAPTURE(name);
      if (name.find(".lora_") != std::string::npos) {
        ++adapters;
        CHECK(values != early.parameters.at(name));  // the adapters train (B from step 1, A once B is not zero)
      } else {
        const bool projection = name.find("layers.") != std::string::npos && !name.ends_with("norm.weight");
        packed += projection && name.ends_with(".weight");
        CHECK(values == early.parameters.at(name));  // everything else is frozen
      }
    }
    CHECK(adapters == 2 * 7 * 2);
    CHECK(packed == 7 * 2);
  }
  // Checkpointed blocks (the packed product and the adapters recomputed, or replayed) train the same bits.
  for (const char* policy : {"full", "selective"}) {
    CAPTURE(policy);
    const nn::ActivationCheckpointPolicy checkpointing = nn::ActivationCheckpointPolicy::parse(policy);
    check_bitwise(train_unsharded(setup, 3),
                  train_fsdp(setup, {.world = 3, .activation_checkpointing = checkpointing}));
  }
}

TEST_CASE("fsdp: float8 training with float8 all-gathers on 1, 2, 3, 5 ranks is bitwise single-rank float8") {
  // Every block projection trains in float8. The single process scales each
  // weight by its own amax; the FSDP ranks gather f8e4m3 codes at the scale
  // precompute_float8_scales derives from every rank's shard: the same codes,
  // so the same training, bit for bit.
  TrainingSetup setup = with_model_change(llama(), "float8 projections", [](nn::Module& model) {
    for (const auto& [name, module] : model.named_modules()) {
      auto* linear = dynamic_cast<nn::Linear*>(module);
      if (linear != nullptr && name.starts_with("layers.")) linear->use_float8();
    }
  });
  setup.steps = 4;
  std::atomic<int64_t> scaled{0};  // every rank's thread writes it
  setup.after_weights_change = [&scaled](nn::Module& model) { scaled = precompute_float8_scales(model); };
  const TrainingResult plain = train_unsharded(llama(), 2);
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    const TrainingResult expected = train_unsharded(setup, world);
    const TrainingResult sharded = train_fsdp(setup, {.world = world});
    check_bitwise(expected, sharded);
    CHECK(scaled == 2 * 7);
  }
  for (const char* policy : {"full", "selective"}) {
    CAPTURE(policy);
    const nn::ActivationCheckpointPolicy checkpointing = nn::ActivationCheckpointPolicy::parse(policy);
    check_bitwise(train_unsharded(setup, 2),
                  train_fsdp(setup, {.world = 2, .activation_checkpointing = checkpointing}));
  }
  // float8 is not f32: the same model trains to other, near, losses.
  const TrainingResult float8 = train_unsharded(setup, 2);
  CHECK(float8.losses != std::vector<double>(plain.losses.begin(), plain.losses.begin() + 4));
  for (size_t step = 0; step < float8.losses.size(); ++step) {
    CHECK(float8.losses[step] == doctest::Approx(plain.losses[step]).epsilon(0.02));
  }
}

TEST_CASE("fsdp: reshard_after_forward true, false and 2 on 4 ranks give bitwise the same training") {
  for (const TrainingSetup& setup : {tiny(), awkward()}) {
    const TrainingResult expected = train_unsharded(setup, 4);
    for (const ReshardAfterForward mode :
         {ReshardAfterForward::always(), ReshardAfterForward::never(), ReshardAfterForward::to_group_of(2)}) {
      CAPTURE(mode.to_string());
      check_bitwise(expected, train_fsdp(setup, {.world = 4, .reshard_after_forward = mode}));
    }
  }
}

// Its OpenMP teams synchronise inside libgomp, which Debian does not build with
// ThreadSanitizer: under TSan every kernel's team would be reported as racing.
#if defined(__SANITIZE_THREAD__)
constexpr bool kOpenMPInvisibleToSanitizer = true;
#else
constexpr bool kOpenMPInvisibleToSanitizer = false;
#endif

TEST_CASE("fsdp: deterministic mode with 2 intra-op threads per rank is bitwise one process with N micro-batches" *
          doctest::skip(kOpenMPInvisibleToSanitizer)) {
  TrainingSetup setup = awkward();
  setup.threads = 2;
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    check_bitwise(train_unsharded(setup, world), train_fsdp(setup, {.world = world, .deterministic = true}));
  }
}

TEST_CASE("fsdp: HSDP on 2x2 and 2x3 meshes matches unsharded training") {
  for (const TrainingSetup& setup : {tiny(), awkward(), llama()}) {
    CAPTURE(setup.model.name);
    check_across_orders(setup, 4, {.world = 4, .replicate = 2});
    check_across_orders(setup, 6, {.world = 6, .replicate = 2});
  }
}

TEST_CASE("fsdp: gradient accumulation with and without per-micro-batch sync matches unsharded training") {
  TrainingSetup setup = awkward();
  setup.grad_accum = 3;
  // One rank adds its micro-batches in the unsharded order: bitwise.
  check_bitwise(train_unsharded(setup, 3), train_fsdp(setup, {.world = 1}));
  check_bitwise(train_unsharded(setup, 3), train_fsdp(setup, {.world = 1, .sync_every_micro_batch = false}));
  for (int world : {2, 3}) {
    CAPTURE(world);
    for (bool sync : {true, false}) {
      CAPTURE(sync);
      check_across_orders(setup, world * setup.grad_accum, {.world = world, .sync_every_micro_batch = sync});
    }
  }
}

TEST_CASE("fsdp: unused parameters get no gradient and are left alone, as unsharded") {
  TrainingSetup setup = tiny();
  setup.unused_parameters = true;
  TrainingSetup untrained = setup;
  untrained.steps = 0;
  const auto initial = train_unsharded(untrained, 1).parameters.at("unused.weight");
  for (int world : {2, 3}) {
    CAPTURE(world);
    const TrainingResult actual = train_fsdp(setup, {.world = world});
    check_bitwise(train_unsharded(setup, world), actual);
    // No gradient, no AdamW step, no weight decay: still the initial values.
    CHECK(actual.parameters.at("unused.weight") == initial);
  }
}

TEST_CASE("fsdp: the tied embedding and head train as one parameter under uneven sharding") {
  const TrainingSetup setup = awkward();
  TrainingSetup untrained = setup;
  untrained.steps = 0;
  const auto initial = train_unsharded(untrained, 1).parameters.at("model.wte.weight");
  const TrainingResult actual = train_fsdp(setup, {.world = 3});
  CHECK(actual.parameters.count("model.lm_head.weight") == 0);  // listed once, under wte
  CHECK(actual.parameters.at("model.wte.weight") != initial);
  check_bitwise(train_unsharded(setup, 3), actual);
}

// Vocab 97 padded to 104: the 7 zero rows land on the last ranks' shards
// (at 3 ranks: rows 70..103 on rank 2), which initialise them to zero on
// their own and must keep them zero through AdamW with weight decay.
TEST_CASE("fsdp: a padded vocabulary is bitwise unsharded training and its padding rows stay zero on every shard") {
  TrainingSetup setup = awkward();
  setup.model = gpt_recipe({.vocab_size = 97, .vocab_padding_multiple = 8, .block_size = 8, .n_layer = 2,
                            .n_head = 3, .n_embd = 72, .bias = false});
  for (int world : {1, 3, 4}) {
    CAPTURE(world);
    const TrainingResult actual = train_fsdp(setup, {.world = world});
    check_bitwise(train_unsharded(setup, world), actual);
    const std::vector<double>& table = actual.parameters.at("model.wte.weight");
    REQUIRE(table.size() == 104 * 72);
    CHECK(std::vector<double>(table.begin() + 97 * 72, table.end()) == std::vector<double>(7 * 72, 0.0));
    CHECK(std::any_of(table.begin(), table.begin() + 97 * 72, [](double v) { return v != 0.0; }));
  }
}

TEST_CASE("fsdp: clipping uses the global gradient norm") {
  TrainingSetup setup = awkward();
  setup.clip = 0.05;  // below the norms these steps see, so every step clips
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    for (const TrainingResult& unsharded : check_across_orders(setup, world, {.world = world})) {
      for (double norm : unsharded.grad_norms) CHECK(norm > setup.clip);
    }
  }
}

TEST_CASE("fsdp: bf16 parameters with f32 reduction: sharding exact, precision within bf16's") {
  const MixedPrecisionPolicy bf16{.param_dtype = DType::bf16, .reduce_dtype = DType::f32};
  // Sharding adds nothing to bf16's error: 3 ranks compute what 1 rank
  // accumulating the same 3 micro-batches computes (each micro-batch's bf16
  // gradient widened to f32, added in the same order, divided once).
  const TrainingSetup setup = awkward();
  TrainingSetup accumulated = setup;
  accumulated.grad_accum = 3;
  const TrainingResult three_ranks = train_fsdp(setup, {.world = 3, .mp_policy = bf16});
  check_bitwise(train_fsdp(accumulated, {.world = 1, .mp_policy = bf16}), three_ranks);

  // Against f32, with SGD, whose parameter difference is lr times the sum of
  // the gradient differences: RMS(bf16 - f32) / RMS(f32 update) is the
  // relative RMS error of bf16's gradients. bf16 rounds every parameter and
  // activation to 2^-9 relative, forward and backward, and the roundings of
  // a 2-block model's gradient chain add in quadrature to about a percent
  // (measured at most 1.2% per parameter); 10% allows eight times that, and
  // a sharding error would be of the order of the update itself. Each
  // micro-batch loss is a bf16 number (half an ulp: at most 2^-8 relative)
  // of logits ~0.2 whose error is ~2^-9 of that: within 1e-2 (measured 1.8e-3).
  const TrainingSetup sgd = with_sgd(setup);
  TrainingSetup untrained = sgd;
  untrained.steps = 0;
  const TrainingResult initial = train_unsharded(untrained, 1);
  const TrainingResult expected = train_unsharded(sgd, 3);
  const TrainingResult actual = train_fsdp(sgd, {.world = 3, .mp_policy = bf16});
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    INFO("step " << step + 1 << ": loss " << actual.losses[step] << " vs f32 " << expected.losses[step]);
    CHECK(std::abs(actual.losses[step] - expected.losses[step]) <= 1e-2 * expected.losses[step]);
  }
  for (const auto& [name, values] : expected.parameters) {
    double difference = 0.0, update = 0.0;
    for (size_t i = 0; i < values.size(); ++i) {
      difference += std::pow(actual.parameters.at(name)[i] - values[i], 2);
      update += std::pow(values[i] - initial.parameters.at(name)[i], 2);
    }
    INFO(name << ": RMS difference / RMS update = " << std::sqrt(difference / update));
    CHECK(std::sqrt(difference) <= 0.1 * std::sqrt(update));
  }
}
