// The activation formula of train/activation_plan.h.
#include "train/activation_plan.h"

#include <variant>

#include "tensor/error.h"

namespace tessera::train {

namespace {

struct PerToken {
  int64_t block = 0, outside = 0;
  int64_t selective_block = 0;  // what a block checkpointed selectively holds
  int64_t per_sequence_position = 0;  // GPT's position ids (i64), held by wpe's backward
};

// `element`: the activations' bytes; `statistic`: their compute dtype's, in
// which the norms' mean and rstd and the log-sum-exps are kept.
PerToken gpt_per_token(const tessera::nn::GPTConfig& config, int64_t element, int64_t statistic,
                       int64_t padded_vocab) {
  const int64_t C = config.n_embd, H = config.n_head;
  const int64_t masks = config.dropout > 0.0 ? 1 : 0;
  // Selective: its output, and qkv (3C), attention's output and log-sum-exp,
  // attention's projection and the MLP's second product.
  return {.block = (16 + 2 * masks) * C * element + (4 + H) * statistic,
          .outside = (1 + masks) * C * element + C * element + 2 * statistic + padded_vocab * element + statistic,
          .selective_block = 7 * C * element + H * statistic,
          .per_sequence_position = 8};
}

PerToken llama_per_token(const tessera::nn::LlamaConfig& config, int64_t element, int64_t statistic) {
  const int64_t C = config.n_embd, H = config.n_head, F = config.ffn_hidden;
  // Attention takes each key/value head repeated for its query heads: a copy
  // of H D = C values a token for k and for v, except from one key/value head,
  // whose repeat is a view of its D values (nn/grouped_query_attention.cpp).
  const int64_t keys_and_values = 2 * (config.n_kv_head == 1 ? C / H : C);
  // Selective: its output, and the products of wq, wk and wv (not repeated),
  // attention's output and log-sum-exp, and the products of wo, w1, w3, w2.
  const int64_t key_value_width = config.n_kv_head * (C / H);
  return {.block = (6 * C + keys_and_values + 4 * F) * element + (2 + H) * statistic,
          .outside = C * element + C * element + statistic + config.vocab_size * element + statistic,
          .selective_block = (5 * C + 2 * key_value_width + 2 * F) * element + H * statistic};
}

// What LoRA fine-tuning (train/lora_fine_tuning.h: adapters of rank r on the
// block projections, everything else frozen) changes, per token.
struct LoRAPerToken {
  int64_t block = 0;      // each adapter's x A^T (r), kept for B's gradient
  int64_t selective = 0;  // each adapter's two products (r + out), and GPT's unfused first MLP product (4 C)
  // The frozen embedding's output needs no gradient, so the first block's
  // norm records nothing: neither its statistics nor (unless a checkpoint
  // keeps it as its input) the embedding's output are held, nor GPT's
  // dropout mask and position ids.
  int64_t first_norm_statistics = 0;
  int64_t embedding_output = 0;
  int64_t final_norm_output = 0;  // the frozen head's input: its product saves it only for the weight's gradient
  int64_t embedding_mask = 0;
  int64_t per_sequence_position = 0;
};

LoRAPerToken lora_per_token(const ModelConfig& config, int64_t rank, int64_t element, int64_t statistic) {
  if (rank == 0) return {};
  if (const auto* gpt = std::get_if<tessera::nn::GPTConfig>(&config)) {
    const int64_t C = gpt->n_embd;
    const int64_t outputs = 3 * C + C + 4 * C + C;  // qkv, attention's projection, the MLP's fc and proj
    return {.block = 4 * rank * element,
            .selective = (4 * C + 4 * rank + outputs) * element,
            .first_norm_statistics = 2 * statistic,
            .embedding_output = C * element,
            .final_norm_output = C * element,
            .embedding_mask = (gpt->dropout > 0.0 ? C : 0) * element,
            .per_sequence_position = 8};
  }
  const auto& llama = std::get<tessera::nn::LlamaConfig>(config);
  const int64_t C = llama.n_embd, F = llama.ffn_hidden, K = llama.n_kv_head * (C / llama.n_head);
  const int64_t outputs = C + 2 * K + C + 2 * F + C;  // wq, wk, wv, wo, w1, w3, w2
  return {.block = 7 * rank * element,
          .selective = (7 * rank + outputs) * element,
          .first_norm_statistics = statistic,
          .embedding_output = C * element,
          .final_norm_output = C * element};
}

}  // namespace

ActivationBytes plan_activations(const ModelConfig& config, const ActivationShape& shape) {
  TESSERA_CHECK(shape.batch >= 1 && shape.seq_len >= 1, "plan_activations: batch {} and sequence length {} must be "
                "positive", shape.batch, shape.seq_len);
  const auto element = static_cast<int64_t>(element_size(shape.dtype));
  const auto statistic = static_cast<int64_t>(element_size(compute_dtype(shape.dtype)));
  const PerToken per_token = std::holds_alternative<tessera::nn::GPTConfig>(config)
                                 ? gpt_per_token(std::get<tessera::nn::GPTConfig>(config), element, statistic,
                                                 padded_vocab_size(config))
                                 : llama_per_token(std::get<tessera::nn::LlamaConfig>(config), element, statistic);
  const int64_t tokens = shape.batch * shape.seq_len;
  const int64_t width = std::visit([](const auto& c) { return c.n_embd; }, config);
  const bool selective = shape.checkpointing.mode == tessera::nn::ActivationCheckpointPolicy::Mode::selective;
  const LoRAPerToken lora = lora_per_token(config, shape.lora_rank, element, statistic);
  ActivationBytes bytes{
      .block = (per_token.block + lora.block) * tokens,
      .checkpointed_block =
          (selective ? per_token.selective_block + lora.selective : width * element) * tokens,
      .outside_blocks = (per_token.outside - lora.embedding_mask - lora.final_norm_output) * tokens +
                        (per_token.per_sequence_position - lora.per_sequence_position) * shape.seq_len +
                        statistic};  // and the loss
  const bool first_checkpointed = shape.checkpointing.checkpoints(0);
  if (!first_checkpointed) bytes.outside_blocks -= lora.embedding_output * tokens;
  bytes.total = bytes.outside_blocks;
  for (int64_t index = 0; index < n_layer(config); ++index) {
    bytes.total += shape.checkpointing.checkpoints(index) ? bytes.checkpointed_block : bytes.block;
  }
  if (!first_checkpointed) bytes.total -= lora.first_norm_statistics * tokens;
  return bytes;
}

ActivationBytes plan_activations(const TrainConfig& config) {
  return plan_activations(config.model_config(), {.batch = config.batch, .seq_len = config.seq_len,
                                                  .dtype = config.param_dtype, .checkpointing = config.ac,
                                                  .lora_rank = config.lora_rank});
}

int64_t checkpointed_blocks(const TrainConfig& config) {
  int64_t count = 0;
  for (int64_t index = 0; index < n_layer(config.model_config()); ++index) {
    count += config.ac.checkpoints(index) ? 1 : 0;
  }
  return count;
}

}  // namespace tessera::train
