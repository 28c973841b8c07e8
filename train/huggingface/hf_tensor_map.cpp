// tessera's parameter names and layouts <-> GPT2LMHeadModel's and LlamaForCausalLM's.
#include "train/huggingface/hf_tensor_map.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace tessera::train {

namespace {

using tessera::Shape;
using tessera::Tensor;
namespace ops = tessera::ops;

struct Rename {
  std::string_view hf_name;
  HfLayout layout;
};

// Names within a block, tessera's -> HF's.
const std::map<std::string_view, Rename> kGptBlockNames = {
    {"ln1.weight", {"ln_1.weight", HfLayout::same}},
    {"ln1.bias", {"ln_1.bias", HfLayout::same}},
    {"ln2.weight", {"ln_2.weight", HfLayout::same}},
    {"ln2.bias", {"ln_2.bias", HfLayout::same}},
    {"attn.qkv.weight", {"attn.c_attn.weight", HfLayout::transposed}},
    {"attn.qkv.bias", {"attn.c_attn.bias", HfLayout::same}},
    {"attn.proj.weight", {"attn.c_proj.weight", HfLayout::transposed}},
    {"attn.proj.bias", {"attn.c_proj.bias", HfLayout::same}},
    {"mlp.fc.weight", {"mlp.c_fc.weight", HfLayout::transposed}},
    {"mlp.fc.bias", {"mlp.c_fc.bias", HfLayout::same}},
    {"mlp.proj.weight", {"mlp.c_proj.weight", HfLayout::transposed}},
    {"mlp.proj.bias", {"mlp.c_proj.bias", HfLayout::same}},
};
const std::map<std::string_view, Rename> kGptTopNames = {
    {"wte.weight", {"transformer.wte.weight", HfLayout::vocab_rows}},
    {"wpe.weight", {"transformer.wpe.weight", HfLayout::same}},
    {"ln_f.weight", {"transformer.ln_f.weight", HfLayout::same}},
    {"ln_f.bias", {"transformer.ln_f.bias", HfLayout::same}},
};
const std::map<std::string_view, Rename> kLlamaBlockNames = {
    {"attention_norm.weight", {"input_layernorm.weight", HfLayout::same}},
    {"ffn_norm.weight", {"post_attention_layernorm.weight", HfLayout::same}},
    {"attention.wq.weight", {"self_attn.q_proj.weight", HfLayout::rotary_halves}},
    {"attention.wk.weight", {"self_attn.k_proj.weight", HfLayout::rotary_halves}},
    {"attention.wv.weight", {"self_attn.v_proj.weight", HfLayout::same}},
    {"attention.wo.weight", {"self_attn.o_proj.weight", HfLayout::same}},
    {"feed_forward.w1.weight", {"mlp.gate_proj.weight", HfLayout::same}},
    {"feed_forward.w3.weight", {"mlp.up_proj.weight", HfLayout::same}},
    {"feed_forward.w2.weight", {"mlp.down_proj.weight", HfLayout::same}},
};
const std::map<std::string_view, Rename> kLlamaTopNames = {
    {"tok_embeddings.weight", {"model.embed_tokens.weight", HfLayout::same}},
    {"norm.weight", {"model.norm.weight", HfLayout::same}},
    {"output.weight", {"lm_head.weight", HfLayout::same}},
};

// "blocks.11.attn.qkv.weight" -> ("11", "attn.qkv.weight") when it starts with `stack` + ".".
std::optional<std::pair<std::string, std::string>> split_block_name(const std::string& name, std::string_view stack) {
  if (!name.starts_with(stack) || name.size() <= stack.size() || name[stack.size()] != '.') return std::nullopt;
  const size_t index_begin = stack.size() + 1;
  const size_t dot = name.find('.', index_begin);
  if (dot == std::string::npos || dot == index_begin) return std::nullopt;
  const std::string index = name.substr(index_begin, dot - index_begin);
  if (index.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::pair{index, name.substr(dot + 1)};
}

std::optional<Rename> find_rename(const std::map<std::string_view, Rename>& names, const std::string& name) {
  const auto found = names.find(name);
  if (found == names.end()) return std::nullopt;
  return found->second;
}

Shape hf_shape_of(const ModelConfig& config, HfLayout layout, const Shape& shape) {
  switch (layout) {
    case HfLayout::transposed: return {shape.at(1), shape.at(0)};
    case HfLayout::vocab_rows: return {vocab_size(config), shape.at(1)};
    case HfLayout::same:
    case HfLayout::rotary_halves: return shape;
  }
  return shape;
}

// [H*D, C] in HF's row order -> tessera's, or back (`to_hf`): HF's rows of a
// head are [j][i] (j = half, i = pair), tessera's [i][j].
Tensor permute_rotary_rows(const Tensor& rows, int64_t head_dim, bool to_hf) {
  const int64_t heads = rows.size(0) / head_dim, columns = rows.size(1);
  const Shape grouped = to_hf ? Shape{heads, head_dim / 2, 2, columns} : Shape{heads, 2, head_dim / 2, columns};
  return ops::reshape(ops::transpose(ops::view(ops::contiguous(rows), grouped), 1, 2), {heads * head_dim, columns});
}

}  // namespace

HfTensor hf_tensor_for(const ModelConfig& config, const std::string& name, const Shape& shape) {
  const bool is_gpt = family_of(config) == ModelFamily::gpt;
  std::optional<Rename> rename = find_rename(is_gpt ? kGptTopNames : kLlamaTopNames, name);
  std::string hf_name = rename ? std::string(rename->hf_name) : "";
  if (!rename) {
    if (const auto block = split_block_name(name, is_gpt ? "blocks" : "layers")) {
      rename = find_rename(is_gpt ? kGptBlockNames : kLlamaBlockNames, block->second);
      if (rename) {
        hf_name = fmt::format("{}.{}.{}", is_gpt ? "transformer.h" : "model.layers", block->first, rename->hf_name);
      }
    }
  }
  TESSERA_CHECK(rename.has_value(), "{} has no Hugging Face name for the parameter '{}'",
                is_gpt ? "GPT2LMHeadModel" : "LlamaForCausalLM", name);
  HfTensor tensor{name, hf_name, rename->layout, shape, hf_shape_of(config, rename->layout, shape), 0};
  if (tensor.layout == HfLayout::rotary_halves) {
    tensor.head_dim = std::get<tessera::nn::LlamaConfig>(config).head_dim();
    TESSERA_CHECK(shape.size() == 2 && shape[0] % tensor.head_dim == 0 && tensor.head_dim % 2 == 0,
                  "'{}' of shape {} is not whole heads of {} rows", name, shape, tensor.head_dim);
  }
  return tensor;
}

bool is_ignored_hf_tensor(const std::string& hf_name) {
  return hf_name.ends_with(".attn.bias") || hf_name.ends_with(".attn.masked_bias") ||
         hf_name.ends_with(".rotary_emb.inv_freq");
}

Tensor to_hf_layout(const HfTensor& tensor, const Tensor& whole) {
  switch (tensor.layout) {
    case HfLayout::same: return whole;
    case HfLayout::transposed: return ops::contiguous(ops::transpose(whole, 0, 1));
    case HfLayout::vocab_rows: return ops::narrow(whole, 0, 0, tensor.hf_shape[0]);
    case HfLayout::rotary_halves: return permute_rotary_rows(whole, tensor.head_dim, /*to_hf=*/true);
  }
  return whole;
}

void read_in_tessera_layout(const HfTensor& tensor, Tensor destination, const Shape& offsets,
                            const HfBoxReader& read_hf_box) {
  if (destination.numel() == 0) return;
  switch (tensor.layout) {
    case HfLayout::same:
      read_hf_box(destination, offsets);
      return;
    case HfLayout::transposed:  // tessera's rows are HF's columns: a strided view receives them
      read_hf_box(ops::transpose(destination, 0, 1), {offsets[1], offsets[0]});
      return;
    case HfLayout::vocab_rows: {
      const int64_t stored_rows = tensor.hf_shape[0];
      const int64_t first = offsets[0], rows = destination.size(0);
      const int64_t stored = std::clamp<int64_t>(stored_rows - first, 0, rows);
      if (stored > 0) read_hf_box(ops::narrow(destination, 0, 0, stored), offsets);
      if (stored < rows) {
        Tensor padding = ops::narrow(destination, 0, stored, rows - stored);
        ops::zero_(padding);
      }
      return;
    }
    case HfLayout::rotary_halves: {
      const int64_t head_dim = tensor.head_dim;
      const int64_t first = offsets[0], rows = destination.size(0);
      const int64_t first_head = first / head_dim, end_head = (first + rows + head_dim - 1) / head_dim;
      const Tensor heads = ops::empty({(end_head - first_head) * head_dim, destination.size(1)},
                                      {.dtype = destination.dtype(), .device = tessera::kCPU});
      read_hf_box(heads, {first_head * head_dim, offsets[1]});
      const Tensor in_tessera_order = permute_rotary_rows(heads, head_dim, /*to_hf=*/false);
      ops::copy_(destination, ops::narrow(in_tessera_order, 0, first - first_head * head_dim, rows));
      return;
    }
  }
}

}  // namespace tessera::train
