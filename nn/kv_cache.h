// nn::KVCache: the keys and values a decoder's attention layers computed for
// the tokens seen so far, so that the next token runs through the model alone
// (incremental decoding) instead of with its whole context again. For
// inference: nothing here records a graph.
//   per layer: keys, values [B, Hkv, capacity, D], allocated once, up front;
//   length(): the slots filled, the same for every sequence of the batch;
//   padding(b): the leading slots of sequence b that hold left padding: no
//     query attends to them, and the sequence's positions start at 0 at its
//     first real token (Hugging Face's positions from an attention mask).
// One cached forward (CausalLM::forward_cached) places T new tokens at slots
// [length, length + T): begin_step checks they fit and builds their positions
// and mask (a CachedStep, shared by every layer), each layer store()s its new
// keys and values and attend()s over slots [0, length + T), and advance()
// counts the slots in. A step that throws before advance() leaves the cache
// as it was: slots past length() are never read.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "nn/module.h"

namespace tessera::nn {

// What a model's cache holds per token: one key and one value row of
// head_dim per kv head, in every layer.
struct KVCacheLayout {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::f32;
  bool operator==(const KVCacheLayout&) const = default;
};

// What every layer of one cached forward shares.
struct CachedStep {
  int64_t start = 0;  // the first new token's slot: the cache's length() before the step
  int64_t count = 0;  // T, new tokens per sequence
  // [B, T] i64 on the cache's device: each new token's position in its own
  // sequence (slot - padding, 0 on a padding slot).
  Tensor positions;
  // [B, 1, 1, T, start + T] in the cache's dtype, added to the attention
  // scores: 0 where a new token may attend (a slot of its own sequence at or
  // before its own), -inf elsewhere. A padding slot's query attends to itself
  // alone, so no row is all -inf (its softmax would be NaN, and a NaN in a
  // padding slot's keys would reach the real rows through 0 * NaN). Undefined
  // when nothing is masked (one new token per sequence and no padding), and
  // for a causal prefill (below), which attend() masks when asked to.
  Tensor mask;
  // No padding and an empty cache: plain causal attention over the new tokens
  // alone, which the attention layers run exactly as their forward does.
  bool causal_prefill = false;
};

class KVCache {
 public:
  // `batch` sequences of at most `capacity` slots on `device`. padding: per
  // sequence (empty: none), each in [0, capacity).
  KVCache(const KVCacheLayout& layout, int64_t batch, int64_t capacity, Device device,
          std::vector<int64_t> padding = {});

  const KVCacheLayout& layout() const { return layout_; }
  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& padding() const { return padding_; }
  // The keys and values of every layer: 2 * L * B * Hkv * capacity * D elements.
  int64_t bytes() const;

  // Whether `new_tokens` more slots fit in the capacity with every sequence's
  // positions below `max_positions` (a model's block_size).
  bool fits(int64_t new_tokens, int64_t max_positions) const;
  // The step that places `new_tokens` tokens per sequence; throws
  // tessera::Error, naming the limit, when they do not fit.
  CachedStep begin_step(int64_t new_tokens, int64_t max_positions) const;
  // Writes layer `layer`'s keys and values of the step's tokens into their
  // slots. k, v: [B, T, Hkv, D], any strides.
  void store(int64_t layer, const CachedStep& step, const Tensor& k, const Tensor& v);
  // Attention of the step's queries over layer `layer`'s slots [0, start + T):
  // softmax(q K^T / sqrt(D) + mask) V. q: [B, T, H, D] with H a multiple of
  // Hkv (query head j reads kv head j / (H / Hkv)) -> [B, T, H, D].
  Tensor attend(int64_t layer, const CachedStep& step, const Tensor& q) const;
  // Counts the step's slots in, once every layer has stored its keys and values.
  void advance(const CachedStep& step);
  // Empties the cache for a new batch of prompts (the buffers stay).
  void reset(std::vector<int64_t> padding = {});

 private:
  void check_layer(int64_t layer, const char* op) const;
  // The step's mask (CachedStep::mask), built on the host.
  Tensor mask_of(const CachedStep& step) const;

  KVCacheLayout layout_;
  int64_t batch_;
  int64_t capacity_;
  Device device_;
  std::vector<int64_t> padding_;
  int64_t length_ = 0;
  std::vector<Tensor> keys_;    // per layer: [B, Hkv, capacity, D]
  std::vector<Tensor> values_;  // per layer: [B, Hkv, capacity, D]
};

// A cached forward calls a child's forward_cached directly, past its
// operator() and so past its forward hooks (FSDP's all-gather among them):
// throws tessera::Error naming `caller` when `module` has any.
void check_no_forward_hooks(const Module& module, std::string_view caller);

}  // namespace tessera::nn
