// Where each of tessera's parameters lives in a Hugging Face checkpoint, and
// how its layout differs there.
//
// GPT2LMHeadModel (names under "transformer."; files saved by older versions
// drop that prefix, and the loader accepts both):
//   wte.weight [Vp, C]          wte.weight [V, C]           (rows past V: tessera's padding)
//   wpe.weight, ln_f.*          wpe.weight, ln_f.*
//   blocks.{i}.ln1.*, ln2.*     h.{i}.ln_1.*, ln_2.*
//   blocks.{i}.attn.qkv.*       h.{i}.attn.c_attn.*         (weight transposed: HF's Conv1D is [in, out])
//   blocks.{i}.attn.proj.*      h.{i}.attn.c_proj.*         (transposed)
//   blocks.{i}.mlp.fc.*         h.{i}.mlp.c_fc.*            (transposed)
//   blocks.{i}.mlp.proj.*       h.{i}.mlp.c_proj.*          (transposed)
//   the head is wte, tied       lm_head.weight is not stored
// LlamaForCausalLM:
//   tok_embeddings.weight       model.embed_tokens.weight
//   layers.{i}.attention_norm   model.layers.{i}.input_layernorm
//   layers.{i}.ffn_norm         model.layers.{i}.post_attention_layernorm
//   layers.{i}.attention.wq/wk  model.layers.{i}.self_attn.q_proj/k_proj   (rows permuted, below)
//   layers.{i}.attention.wv/wo  model.layers.{i}.self_attn.v_proj/o_proj
//   layers.{i}.feed_forward.w1/w3/w2   model.layers.{i}.mlp.gate_proj/up_proj/down_proj
//   norm.weight, output.weight  model.norm.weight, lm_head.weight
// Rotary rows: tessera (like Meta's reference) rotates the interleaved pairs
// (2i, 2i+1) of each head; transformers rotates the halves (i, i + D/2), so
// its conversion script permutes the rows of wq and wk within each head:
// HF row h*D + j*D/2 + i holds tessera's row h*D + 2i + j (j = 0, 1).
#pragma once

#include <functional>
#include <string>

#include "tensor/tensor.h"
#include "train/model_family.h"

namespace tessera::train {

enum class HfLayout {
  same,           // identical
  transposed,     // a 2-d weight stored [in, out] (GPT-2's Conv1D)
  rotary_halves,  // rows permuted within each head of head_dim rows (Llama's wq, wk)
  vocab_rows,     // tessera has padding rows past the stored vocab_size rows
};

struct HfTensor {
  std::string name;     // tessera's parameter name, as model_state(model, "") keys it
  std::string hf_name;  // in the checkpoint (GPT-2's with the "transformer." prefix)
  HfLayout layout = HfLayout::same;
  tessera::Shape shape;     // tessera's
  tessera::Shape hf_shape;  // in the checkpoint
  int64_t head_dim = 0;     // rotary_halves only
};

// Where the parameter `name` of shape `shape` of a model of `config` lives.
// Throws tessera::Error for a name the architecture does not have.
HfTensor hf_tensor_for(const ModelConfig& config, const std::string& name, const tessera::Shape& shape);

// Tensors transformers may store that are not parameters tessera loads:
// GPT-2's causal-mask buffers (attn.bias, attn.masked_bias) and Llama's
// rotary inv_freq from older versions.
bool is_ignored_hf_tensor(const std::string& hf_name);

// The checkpoint's tensor from tessera's whole parameter (export).
tessera::Tensor to_hf_layout(const HfTensor& tensor, const tessera::Tensor& whole);

// Fills `destination`, tessera's box of the parameter starting at
// `offsets`, through `read_hf_box(box, box_offsets)`, which fills a box of
// the checkpoint's tensor. Only the checkpoint box that covers the
// destination is asked for (for rotary rows, the whole heads it touches;
// tessera's padding rows are zeroed, not read).
using HfBoxReader = std::function<void(const tessera::Tensor& box, const tessera::Shape& box_offsets)>;
void read_in_tessera_layout(const HfTensor& tensor, tessera::Tensor destination, const tessera::Shape& offsets,
                            const HfBoxReader& read_hf_box);

}  // namespace tessera::train
