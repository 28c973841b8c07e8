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
  ActivationBytes bytes{.block = per_token.block * tokens,
                        .checkpointed_block = (selective ? per_token.selective_block : width * element) * tokens,
                        .outside_blocks = per_token.outside * tokens +
                                          per_token.per_sequence_position * shape.seq_len + statistic};  // and the loss
  bytes.total = bytes.outside_blocks;
  for (int64_t index = 0; index < n_layer(config); ++index) {
    bytes.total += shape.checkpointing.checkpoints(index) ? bytes.checkpointed_block : bytes.block;
  }
  return bytes;
}

ActivationBytes plan_activations(const TrainConfig& config) {
  return plan_activations(config.model_config(), {.batch = config.batch, .seq_len = config.seq_len,
                                                  .dtype = config.param_dtype, .checkpointing = config.ac});
}

int64_t checkpointed_blocks(const TrainConfig& config) {
  int64_t count = 0;
  for (int64_t index = 0; index < n_layer(config.model_config()); ++index) {
    count += config.ac.checkpoints(index) ? 1 : 0;
  }
  return count;
}

}  // namespace tessera::train
