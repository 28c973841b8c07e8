// nn::KVCache: the buffers, the step's positions and mask, and the attention
// over the cached slots, composed of tensor ops (matmul, softmax), so it runs
// on every device the ops do.
#include "nn/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/ops.h"

namespace tessera::nn {

namespace {

void check_padding(const std::vector<int64_t>& padding, int64_t batch, int64_t capacity) {
  TESSERA_CHECK(padding.empty() || static_cast<int64_t>(padding.size()) == batch,
                "KVCache: padding has {} entries for a batch of {} sequences (one each, or none)", padding.size(),
                batch);
  for (size_t b = 0; b < padding.size(); ++b) {
    TESSERA_CHECK(padding[b] >= 0 && padding[b] < capacity,
                  "KVCache: padding {} of sequence {} is outside [0, capacity {}) (a sequence needs a slot of its own)",
                  padding[b], b, capacity);
  }
}

// 1/sqrt(D) as the fused attention kernels compute it: in float for every
// float dtype but f64.
double attention_scale(int64_t head_dim, DType dtype) {
  if (dtype == DType::f64) return 1.0 / std::sqrt(static_cast<double>(head_dim));
  return static_cast<double>(1.0f / std::sqrt(static_cast<float>(head_dim)));
}

}  // namespace

KVCache::KVCache(const KVCacheLayout& layout, int64_t batch, int64_t capacity, Device device,
                 std::vector<int64_t> padding)
    : layout_(layout), batch_(batch), capacity_(capacity), device_(device) {
  TESSERA_CHECK(layout.num_layers > 0 && layout.num_kv_heads > 0 && layout.head_dim > 0,
                "KVCache: layers ({}), kv heads ({}) and head_dim ({}) must be positive", layout.num_layers,
                layout.num_kv_heads, layout.head_dim);
  TESSERA_CHECK(is_floating(layout.dtype), "KVCache: keys and values need a floating dtype, got {}",
                dtype_name(layout.dtype));
  TESSERA_CHECK(batch > 0, "KVCache: batch must be positive, got {}", batch);
  TESSERA_CHECK(capacity > 0, "KVCache: capacity must be positive, got {}", capacity);
  reset(std::move(padding));
  const Shape shape{batch, layout.num_kv_heads, capacity, layout.head_dim};
  for (int64_t layer = 0; layer < layout.num_layers; ++layer) {
    keys_.push_back(ops::empty(shape, {.dtype = layout.dtype, .device = device}));
    values_.push_back(ops::empty(shape, {.dtype = layout.dtype, .device = device}));
  }
}

int64_t KVCache::bytes() const {
  return 2 * layout_.num_layers * batch_ * layout_.num_kv_heads * capacity_ * layout_.head_dim *
         static_cast<int64_t>(element_size(layout_.dtype));
}

void KVCache::reset(std::vector<int64_t> padding) {
  check_padding(padding, batch_, capacity_);
  padding_ = padding.empty() ? std::vector<int64_t>(static_cast<size_t>(batch_), 0) : std::move(padding);
  length_ = 0;
}

bool KVCache::fits(int64_t new_tokens, int64_t max_positions) const {
  const int64_t least_padding = *std::min_element(padding_.begin(), padding_.end());
  return new_tokens >= 1 && new_tokens <= capacity_ - length_ &&
         length_ + new_tokens - least_padding <= max_positions;
}

CachedStep KVCache::begin_step(int64_t new_tokens, int64_t max_positions) const {
  TESSERA_CHECK(new_tokens >= 1, "KVCache: a step needs at least one new token, got {}", new_tokens);
  TESSERA_CHECK(new_tokens <= capacity_ - length_,
                "KVCache: the cache is full: {} of its {} slots are filled, {} more tokens do not fit", length_,
                capacity_, new_tokens);
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t last_position = length_ + new_tokens - 1 - padding_[static_cast<size_t>(b)];
    TESSERA_CHECK(last_position < max_positions,
                  "KVCache: sequence {} would reach position {}, but the model has positions [0, {}) (its "
                  "block_size)",
                  b, last_position, max_positions);
  }
  const int64_t T = new_tokens;
  CachedStep step{.start = length_, .count = T, .positions = Tensor(), .mask = Tensor(), .causal_prefill = false};
  std::vector<int64_t> positions(static_cast<size_t>(batch_ * T));
  bool any_padding = false;
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t padding = padding_[static_cast<size_t>(b)];
    any_padding = any_padding || padding > 0;
    for (int64_t t = 0; t < T; ++t) {
      positions[static_cast<size_t>(b * T + t)] = std::max<int64_t>(0, length_ + t - padding);
    }
  }
  step.positions = ops::to(ops::from_vector(positions, {batch_, T}), device_);
  step.causal_prefill = length_ == 0 && !any_padding;
  // One token and no padding sees every filled slot; a causal prefill runs
  // the attention layers' own causal kernel (attend() builds its mask if asked).
  if (!(T == 1 && !any_padding) && !step.causal_prefill) step.mask = mask_of(step);
  return step;
}

Tensor KVCache::mask_of(const CachedStep& step) const {
  const int64_t T = step.count, L = step.start + T;
  // 0 where slot j is visible to the query at slot i: j of the sequence
  // (j >= padding) and not after i, or j == i for a padding query.
  constexpr float kHidden = -std::numeric_limits<float>::infinity();
  std::vector<float> mask(static_cast<size_t>(batch_ * T * L), kHidden);
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t padding = padding_[static_cast<size_t>(b)];
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = step.start + t;
      float* row = mask.data() + (b * T + t) * L;
      if (i < padding) {
        row[i] = 0.0f;
      } else {
        std::fill(row + padding, row + i + 1, 0.0f);
      }
    }
  }
  return ops::to(ops::to(ops::from_vector(mask, {batch_, 1, 1, T, L}), layout_.dtype), device_);
}

void KVCache::check_layer(int64_t layer, const char* op) const {
  TESSERA_CHECK(layer >= 0 && layer < layout_.num_layers, "KVCache::{}: layer {} is outside [0, {})", op, layer,
                layout_.num_layers);
}

void KVCache::store(int64_t layer, const CachedStep& step, const Tensor& k, const Tensor& v) {
  check_layer(layer, "store");
  const Shape expected{batch_, step.count, layout_.num_kv_heads, layout_.head_dim};
  TESSERA_CHECK(k.defined() && v.defined() && k.sizes() == expected && v.sizes() == expected,
                "KVCache::store: keys and values must be [B, T, Hkv, D] = {}, got {} and {}", expected,
                k.defined() ? k.sizes() : Shape{}, v.defined() ? v.sizes() : Shape{});
  TESSERA_CHECK(step.start == length_ && step.start + step.count <= capacity_,
                "KVCache::store: the step starts at slot {}, but the cache holds {} (a step of another cache, or one "
                "already advanced)",
                step.start, length_);
  // [B, T, Hkv, D] -> [B, Hkv, T, D] into slots [start, start + T).
  Tensor key_slots = ops::narrow(keys_[static_cast<size_t>(layer)], 2, step.start, step.count);
  Tensor value_slots = ops::narrow(values_[static_cast<size_t>(layer)], 2, step.start, step.count);
  ops::copy_(key_slots, ops::transpose(k, 1, 2));
  ops::copy_(value_slots, ops::transpose(v, 1, 2));
}

Tensor KVCache::attend(int64_t layer, const CachedStep& step, const Tensor& q) const {
  check_layer(layer, "attend");
  const int64_t Hkv = layout_.num_kv_heads, D = layout_.head_dim;
  TESSERA_CHECK(q.defined() && q.dim() == 4 && q.size(0) == batch_ && q.size(1) == step.count && q.size(3) == D &&
                    q.size(2) % Hkv == 0,
                "KVCache::attend: queries must be [B {}, T {}, H (a multiple of {} kv heads), D {}], got {}", batch_,
                step.count, Hkv, D, q.defined() ? q.sizes() : Shape{});
  const int64_t B = batch_, T = step.count, H = q.size(2), group = H / Hkv, L = step.start + T;
  // The group*T queries that read one kv head form one matrix:
  // [B, T, Hkv, group, D] -> [B, Hkv, group, T, D] -> [B, Hkv, group*T, D].
  const Tensor scaled = ops::mul(q, attention_scale(D, layout_.dtype));
  const Tensor grouped =
      ops::reshape(ops::permute(ops::view(scaled, {B, T, Hkv, group, D}), {0, 2, 3, 1, 4}), {B, Hkv, group * T, D});
  const Tensor keys = ops::narrow(keys_[static_cast<size_t>(layer)], 2, 0, L);  // [B, Hkv, L, D]
  const Tensor values = ops::narrow(values_[static_cast<size_t>(layer)], 2, 0, L);
  Tensor scores = ops::matmul(grouped, ops::transpose(keys, 2, 3));  // [B, Hkv, group*T, L]
  const Tensor mask = step.mask.defined() || !step.causal_prefill || T == 1 ? step.mask : mask_of(step);
  if (mask.defined()) {
    // [B, Hkv, group, T, L] + [B, 1, 1, T, L]
    scores = ops::view(ops::add(ops::view(scores, {B, Hkv, group, T, L}), mask), {B, Hkv, group * T, L});
  }
  const Tensor out = ops::matmul(ops::softmax(scores, -1), values);  // [B, Hkv, group*T, D]
  // [B, Hkv, group, T, D] -> [B, T, Hkv, group, D] -> [B, T, H, D]
  return ops::reshape(ops::permute(ops::view(out, {B, Hkv, group, T, D}), {0, 3, 1, 2, 4}), {B, T, H, D});
}

void KVCache::advance(const CachedStep& step) {
  TESSERA_CHECK(step.start == length_,
                "KVCache::advance: the step starts at slot {}, but the cache holds {} (advanced twice?)", step.start,
                length_);
  length_ += step.count;
}

void check_no_forward_hooks(const Module& module, std::string_view caller) {
  TESSERA_CHECK(!module.has_forward_hooks(),
                "{}: {} has forward hooks (FSDP's all-gather, say), which a cached forward does not run; generate "
                "from an unsharded model without hooks on its blocks",
                caller, module.type_name());
}

}  // namespace tessera::nn
