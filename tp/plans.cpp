// The GPT and Llama plans, their checks, and loss parallel on their heads.
#include "tp/plans.h"

#include "tp/loss_parallel.h"

namespace tessera::tp {

namespace {

const Layout kReplicate = dist::Replicate{};
const Layout kSequence = dist::Shard{1};  // [B, T, C] split on T

ParallelStylePtr gather_sequence_on_entry() {
  return prepare_module_input({.input_layouts = {kSequence}, .desired_input_layouts = {kReplicate}});
}

void check_heads_divide(const std::string& model, const char* what, int64_t heads, int64_t tp) {
  TESSERA_CHECK(heads % tp == 0,
                "tensor parallelism: {} has {} = {}, which the tp size {} does not divide (each rank computes whole "
                "heads)",
                model, what, heads, tp);
}

// The loss on each rank's vocabulary columns, and the gather that gives {idx}
// whole logits.
void install_loss_parallel(nn::CausalLM& model, const dist::DeviceMesh& tp_mesh) {
  const int64_t classes = model.vocab_size();
  const int64_t columns = model.padded_vocab_size();
  model.set_sharded_logits({
      .loss =
          [tp_mesh, classes, columns](const Tensor& local_logits, const Tensor& targets) {
            return vocab_parallel_cross_entropy(local_logits, targets, tp_mesh.group(0), classes, -100, columns);
          },
      .gather =
          [tp_mesh, columns](const Tensor& local_logits) {
            return move_activation(local_logits, tp_mesh, dist::Shard{-1}, kReplicate, std::nullopt, columns);
          },
  });
}

}  // namespace

ParallelizePlan gpt_plan(const PlanOptions& options) {
  const int64_t chunks = options.async_chunks;
  ParallelizePlan plan = {
      {"wte", vocab_parallel_embedding({.output_layout = kSequence})},
      // [T, C] position rows: each rank keeps its positions' rows.
      {"wpe", prepare_module_output({.output_layout = kReplicate, .desired_output_layout = dist::Shard{0}})},
      {"drop", sequence_parallel()},
      {"blocks.*.ln1", sequence_parallel()},
  };
  // qkv is attention's one reader of its input: async, it gathers the
  // sequence itself, in chunks.
  if (chunks == 0) {
    plan.emplace_back("blocks.*.attn", gather_sequence_on_entry());
    plan.emplace_back("blocks.*.attn.qkv", colwise_parallel({.input_layout = std::nullopt, .sections = 3}));
  } else {
    plan.emplace_back("blocks.*.attn.qkv",
                      colwise_parallel({.input_layout = kSequence, .sections = 3, .async_chunks = chunks}));
  }
  const ParallelizePlan rest = {
      {"blocks.*.attn.proj", rowwise_parallel({.output_layout = kSequence, .async_chunks = chunks})},
      {"blocks.*.attn.drop", sequence_parallel()},
      {"blocks.*.ln2", sequence_parallel()},
      {"blocks.*.mlp.fc", colwise_parallel({.input_layout = kSequence, .async_chunks = chunks})},
      {"blocks.*.mlp.proj", rowwise_parallel({.output_layout = kSequence, .async_chunks = chunks})},
      {"blocks.*.mlp.drop", sequence_parallel()},
      {"ln_f", sequence_parallel()},
      {"lm_head", colwise_parallel({.input_layout = kSequence})},
  };
  plan.insert(plan.end(), rest.begin(), rest.end());
  return plan;
}

ParallelizePlan llama_plan(const PlanOptions& options) {
  const ParallelStylePtr from_prepared_input = colwise_parallel({.input_layout = std::nullopt});
  const int64_t chunks = options.async_chunks;
  // Async, one chunked gather feeds each module's column-wise products.
  const auto gather_into = [chunks](std::vector<std::string> children) {
    return chunks == 0 ? gather_sequence_on_entry()
                       : gather_sequence_into({.children = std::move(children), .async_chunks = chunks});
  };
  return {
      {"tok_embeddings", vocab_parallel_embedding({.output_layout = kSequence})},
      {"layers.*.attention_norm", sequence_parallel()},
      {"layers.*.attention", gather_into({"wq", "wk", "wv"})},
      {"layers.*.attention.wq", from_prepared_input},
      {"layers.*.attention.wk", from_prepared_input},
      {"layers.*.attention.wv", from_prepared_input},
      {"layers.*.attention.wo", rowwise_parallel({.output_layout = kSequence, .async_chunks = options.async_chunks})},
      {"layers.*.ffn_norm", sequence_parallel()},
      {"layers.*.feed_forward", gather_into({"w1", "w3"})},
      {"layers.*.feed_forward.w1", from_prepared_input},
      {"layers.*.feed_forward.w3", from_prepared_input},
      {"layers.*.feed_forward.w2",
       rowwise_parallel({.output_layout = kSequence, .async_chunks = options.async_chunks})},
      {"norm", sequence_parallel()},
      {"output", colwise_parallel({.input_layout = kSequence})},
  };
}

void parallelize_gpt(nn::GPT& model, const dist::DeviceMesh& tp_mesh, const PlanOptions& options) {
  const nn::GPTConfig& config = model.config();
  check_heads_divide("the GPT", "n_head", config.n_head, tp_mesh.size());
  parallelize_module(model, tp_mesh, gpt_plan(options));
  install_loss_parallel(model, tp_mesh);
}

void parallelize_llama(nn::Llama& model, const dist::DeviceMesh& tp_mesh, const PlanOptions& options) {
  const nn::LlamaConfig& config = model.config();
  check_heads_divide("the Llama", "n_head", config.n_head, tp_mesh.size());
  check_heads_divide("the Llama", "n_kv_head", config.n_kv_head, tp_mesh.size());
  parallelize_module(model, tp_mesh, llama_plan(options));
  install_loss_parallel(model, tp_mesh);
}

void parallelize_causal_lm(nn::CausalLM& model, const dist::DeviceMesh& tp_mesh, const PlanOptions& options) {
  if (auto* gpt = dynamic_cast<nn::GPT*>(&model)) return parallelize_gpt(*gpt, tp_mesh, options);
  if (auto* llama = dynamic_cast<nn::Llama*>(&model)) return parallelize_llama(*llama, tp_mesh, options);
  fail("tensor parallelism: no plan for a {} (tp/plans.h has GPT and Llama; write a ParallelizePlan for it)",
               model.type_name());
}

}  // namespace tessera::tp
