// train/activation_plan.h against the allocator: what a model holds once its
// forward is done, to the byte, for GPT (with and without dropout, biases,
// a padded vocabulary) and Llama (grouped, one and as many key/value heads
// as query heads) under --ac off, full, every:2 and selective; and the run's figure
// that --plan prints and the memory estimate uses.
#include <doctest/doctest.h>

#include <memory>

#include "autograd/engine.h"
#include "nn/activation_checkpoint.h"
#include "nn/models/causal_lm.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "train/activation_plan.h"
#include "train/lora_fine_tuning.h"
#include "train/model_family.h"
#include "train/resource_limits.h"
#include "train/train_config.h"

using namespace tessera;
using tessera::nn::ActivationCheckpointPolicy;
using tessera::train::ModelConfig;

namespace {

// `fine_tuning`: --lora (and --nf4) applied as train applies them.
int64_t measured_activation_bytes(const ModelConfig& shape, const ActivationCheckpointPolicy& policy, int64_t batch,
                                  int64_t seq, const train::TrainConfig& fine_tuning = {}) {
  manual_seed(21);
  std::unique_ptr<nn::CausalLM> model = train::build_model(shape, kCPU);
  train::prepare_fine_tuning(*model, fine_tuning);
  nn::apply_activation_checkpointing(model->blocks(), policy);
  const int64_t vocab = train::vocab_size(shape);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < batch * seq; ++i) ids.push_back((i * 7 + 1) % vocab);
  const Tensor idx = ops::from_vector(ids, {batch, seq});
  auto counters = std::make_shared<MemoryCounters>();
  int64_t held = 0;
  {
    const MemoryScope scope(counters);
    const Tensor loss = model->loss(idx, idx);
    held = counters->snapshot().live_bytes;
    autograd::backward(loss);
  }
  return held;
}

}  // namespace

TEST_SUITE("activation plan") {

TEST_CASE("the plan is what forward holds, to the byte, GPT and Llama under off, full, every:2 and selective") {
  nn::GPTConfig dropout = nn::GPTConfig::preset("tiny");
  dropout.n_layer = 3;
  dropout.dropout = 0.1;
  nn::GPTConfig awkward{.vocab_size = 97, .vocab_padding_multiple = 8, .block_size = 24, .n_layer = 3, .n_head = 3,
                        .n_embd = 24, .bias = false};
  nn::LlamaConfig grouped = nn::LlamaConfig::preset("llama-tiny");  // 4 heads over 2 key/value heads
  grouped.n_layer = 3;
  nn::LlamaConfig one_kv = nn::LlamaConfig::preset("llama-nano");   // 2 heads over 1
  one_kv.n_layer = 3;
  nn::LlamaConfig full_heads = grouped;
  full_heads.n_kv_head = full_heads.n_head;
  const std::vector<std::pair<const char*, ModelConfig>> models = {
      {"gpt tiny", nn::GPTConfig::preset("tiny")}, {"gpt with dropout", dropout},
      {"gpt, no bias, vocab 97 padded", awkward},   {"llama, grouped kv", grouped},
      {"llama, one kv head", one_kv},               {"llama, kv per head", full_heads}};
  for (const auto& [name, shape] : models) {
    for (const char* policy_text : {"off", "full", "every:2", "selective"}) {
      const ActivationCheckpointPolicy policy = ActivationCheckpointPolicy::parse(policy_text);
      for (const auto& [batch, seq] : {std::pair<int64_t, int64_t>{1, 8}, std::pair<int64_t, int64_t>{3, 24}}) {
        CAPTURE(name);
        CAPTURE(policy_text);
        CAPTURE(batch);
        CAPTURE(seq);
        const int64_t planned =
            train::plan_activation_bytes(shape, {.batch = batch, .seq_len = seq, .checkpointing = policy});
        CHECK(measured_activation_bytes(shape, policy, batch, seq) == planned);
      }
    }
  }
}

TEST_CASE("LoRA and QLoRA: the plan is what forward holds, to the byte, under off, full, every:2 and selective") {
  nn::GPTConfig dropout = nn::GPTConfig::preset("tiny");
  dropout.n_layer = 3;
  dropout.dropout = 0.1;
  nn::LlamaConfig grouped = nn::LlamaConfig::preset("llama-tiny");
  grouped.n_layer = 3;
  nn::LlamaConfig one_kv = nn::LlamaConfig::preset("llama-nano");
  one_kv.n_layer = 3;
  const std::vector<std::pair<const char*, ModelConfig>> models = {
      {"gpt tiny", nn::GPTConfig::preset("tiny")}, {"gpt with dropout", dropout}, {"llama, grouped kv", grouped},
      {"llama, one kv head", one_kv}};
  for (const auto& [name, shape] : models) {
    for (const bool nf4 : {false, true}) {
      train::TrainConfig fine_tuning;
      fine_tuning.lora_rank = 3;
      fine_tuning.nf4 = nf4;
      for (const char* policy_text : {"off", "full", "every:2", "selective"}) {
        CAPTURE(name);
        CAPTURE(nf4);
        CAPTURE(policy_text);
        const ActivationCheckpointPolicy policy = ActivationCheckpointPolicy::parse(policy_text);
        const int64_t planned = train::plan_activation_bytes(
            shape, {.batch = 2, .seq_len = 8, .checkpointing = policy, .lora_rank = 3});
        CHECK(measured_activation_bytes(shape, policy, 2, 8, fine_tuning) == planned);
      }
    }
  }
}

TEST_CASE("the parts: a checkpointed block costs its output, the others their formula") {
  const nn::GPTConfig gpt = nn::GPTConfig::preset("gpt2-124m");
  const train::ActivationBytes off = train::plan_activations(gpt, {.batch = 8, .seq_len = 1024});
  const int64_t tokens = 8 * 1024, C = 768, H = 12;
  CHECK(off.block == tokens * (16 * C * 4 + (4 + H) * 4));
  CHECK(off.checkpointed_block == tokens * C * 4);
  CHECK(off.total == off.outside_blocks + 12 * off.block);
  const train::ActivationBytes full = train::plan_activations(
      gpt, {.batch = 8, .seq_len = 1024, .checkpointing = ActivationCheckpointPolicy::parse("full")});
  CHECK(full.total == full.outside_blocks + 12 * full.checkpointed_block);
  const train::ActivationBytes every4 = train::plan_activations(
      gpt, {.batch = 8, .seq_len = 1024, .checkpointing = ActivationCheckpointPolicy::parse("every:4")});
  CHECK(every4.total == every4.outside_blocks + 3 * every4.checkpointed_block + 9 * every4.block);
  const train::ActivationBytes selective = train::plan_activations(
      gpt, {.batch = 8, .seq_len = 1024, .checkpointing = ActivationCheckpointPolicy::parse("selective")});
  CHECK(selective.checkpointed_block == tokens * (7 * C * 4 + H * 4));
  CHECK(selective.total == selective.outside_blocks + 12 * selective.checkpointed_block);
  // bf16 activations: values in 2 bytes, statistics still in f32.
  const train::ActivationBytes bf16 = train::plan_activations(gpt, {.batch = 8, .seq_len = 1024, .dtype = DType::bf16});
  CHECK(bf16.block == tokens * (16 * C * 2 + (4 + H) * 4));
  CHECK_THROWS_WITH_AS(train::plan_activations(gpt, {.batch = 0, .seq_len = 1024}),
                       doctest::Contains("must be positive"), tessera::Error);
}

TEST_CASE("the run's estimate follows --ac: held activations, and one block brought back by its recompute") {
  train::TrainConfig config;
  config.model = nn::GPTConfig::preset("gpt2-124m");
  config.batch = 8;
  config.seq_len = 1024;
  const int64_t off_estimate = train::estimate_rank_memory(config).activations;
  const train::ActivationBytes off = train::plan_activations(config);
  config.ac = ActivationCheckpointPolicy::parse("full");
  const int64_t full_estimate = train::estimate_rank_memory(config).activations;
  const train::ActivationBytes full = train::plan_activations(config);
  CHECK(off_estimate - full_estimate == (off.total - full.total) - full.block);
  CHECK(train::checkpointed_blocks(config) == 12);
  config.ac = ActivationCheckpointPolicy::parse("every:5");
  CHECK(train::checkpointed_blocks(config) == 2);
}

}  // TEST_SUITE
