// nn::KVCache and CausalLM::forward_cached: incremental decoding gives the
// logits of the whole-sequence forward, for a GPT and for a Llama with
// grouped-query attention (a causal prefill bit for bit; the steps after it
// within kCachedF32Bound in f32 and kCachedF64Bound in f64, as they sum in
// another order); a left-padded batch gives each sequence's own logits;
// RoPE at given positions is forward's rotation at those positions; a cache
// that is full, positions past block_size and every bad argument are refused
// with a tessera::Error that names them, and a refused step leaves the cache
// as it was.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/kv_cache.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/rotary_embedding.h"
#include "tensor/ops.h"
#include "tests/nn/tensor_differences.h"

using namespace tessera;
using testing::max_scaled_difference;

namespace {

// The bounds, in max |cached - uncached| / max(1, max |uncached|) over a
// position's logits. A cached step computes the same sums as forward in
// another order: GEMMs of other row counts (the BLAS blocks the inner dim
// differently, or runs a matrix-vector product), the attention's scores,
// softmax and sum over values as separate ops over the cache where forward
// runs its fused causal kernel. Each reordered sum of K products moves by at
// most ~K u sum |a_i b_i| (u = 2^-24 in f32, 2^-53 in f64), a few units in
// the last place of O(1) activations and logits at these widths (K <= 128);
// the largest seen here is 2.6e-7 in f32 and 6e-16 in f64, an 8x and a 16x
// margin below the bounds. A wrong mask, position or slot moves logits by
// 1e-2 or more.
constexpr double kCachedF32Bound = 2e-6;
constexpr double kCachedF64Bound = 1e-14;

double bound_for(DType dtype) { return dtype == DType::f64 ? kCachedF64Bound : kCachedF32Bound; }

std::vector<int64_t> tokens_of(int64_t count, int64_t vocab, int64_t salt) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < count; ++i) tokens.push_back((i * 37 + salt * 11 + (i / 3) * 5) % vocab);
  return tokens;
}

Tensor row_of(const std::vector<int64_t>& tokens) {
  return ops::from_vector(tokens, {1, static_cast<int64_t>(tokens.size())});
}

nn::GPTConfig small_gpt(DType dtype) {
  nn::GPTConfig config;
  config.vocab_size = 61;  // padded to 64 in the head: forward_cached narrows like forward
  config.vocab_padding_multiple = 64;
  config.block_size = 24;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = 32;
  config.dtype = dtype;
  return config;
}

nn::LlamaConfig small_llama(DType dtype) {
  nn::LlamaConfig config;
  config.vocab_size = 67;
  config.block_size = 24;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_kv_head = 2;  // GQA: two query heads per kv head
  config.n_embd = 32;
  config.ffn_hidden = 48;
  config.dtype = dtype;
  return config;
}

template <typename Model, typename Config>
std::unique_ptr<nn::CausalLM> seeded(const Config& config, uint64_t seed) {
  auto model = std::make_unique<Model>(config, kMeta);
  model->to_empty(kCPU);
  model->reset_parameters(seed);
  model->eval();
  return model;
}

std::unique_ptr<nn::CausalLM> gpt_model(DType dtype) { return seeded<nn::GPT>(small_gpt(dtype), 11); }
std::unique_ptr<nn::CausalLM> llama_model(DType dtype) { return seeded<nn::Llama>(small_llama(dtype), 12); }

// Prefills `prompt` tokens of `tokens`, then decodes the rest one at a time:
// every position's logits [1, T, V], as forward gives them.
Tensor cached_logits_of(nn::CausalLM& model, const std::vector<int64_t>& tokens, int64_t prompt) {
  nn::KVCache cache = model.make_kv_cache(1, static_cast<int64_t>(tokens.size()));
  std::vector<Tensor> pieces{
      model.forward_cached(row_of({tokens.begin(), tokens.begin() + prompt}), cache)};
  for (size_t i = static_cast<size_t>(prompt); i < tokens.size(); ++i) {
    pieces.push_back(model.forward_cached(row_of({tokens[i]}), cache));
  }
  CHECK(cache.length() == static_cast<int64_t>(tokens.size()));
  return ops::cat(pieces, 1);
}

// The cached logits of `tokens` against forward's: the prefill is forward
// on the prompt, bit for bit; every position is forward's on the whole
// sequence within the bound.
void check_cached_matches_forward(nn::CausalLM& model, DType dtype) {
  autograd::NoGradGuard no_grad;
  const std::vector<int64_t> tokens = tokens_of(20, model.vocab_size(), 3);
  const Tensor expected = model(row_of(tokens));  // [1, 20, V]
  for (const int64_t prompt : {int64_t{1}, int64_t{7}, int64_t{20}}) {
    CAPTURE(prompt);
    const Tensor cached = cached_logits_of(model, tokens, prompt);
    REQUIRE(cached.sizes() == expected.sizes());
    CHECK(ops::narrow(cached, 1, 0, prompt).to_vector<double>() ==
          model(row_of({tokens.begin(), tokens.begin() + prompt})).to_vector<double>());
    for (int64_t t = 0; t < 20; ++t) {
      CAPTURE(t);
      CHECK(max_scaled_difference(ops::select(cached, 1, t), ops::select(expected, 1, t)) <= bound_for(dtype));
    }
  }
}

// Sequences of different lengths, left-padded into one batch, against each
// one alone: a padded prefill, then decoding steps; the real positions'
// logits within the bound.
void check_padded_batch_matches_alone(nn::CausalLM& model, DType dtype) {
  autograd::NoGradGuard no_grad;
  const std::vector<int64_t> lengths{9, 4, 1};
  const int64_t longest = 9, steps = 6, B = 3;
  std::vector<std::vector<int64_t>> sequences;
  for (int64_t b = 0; b < B; ++b) sequences.push_back(tokens_of(lengths[b] + steps, model.vocab_size(), b + 1));

  std::vector<int64_t> prefill(static_cast<size_t>(B * longest), 0), padding;
  for (int64_t b = 0; b < B; ++b) {
    padding.push_back(longest - lengths[b]);
    std::copy(sequences[b].begin(), sequences[b].begin() + lengths[b], prefill.begin() + b * longest + padding.back());
  }
  nn::KVCache cache = model.make_kv_cache(B, longest + steps, padding);
  std::vector<Tensor> batch_logits{model.forward_cached(ops::from_vector(prefill, {B, longest}), cache)};
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int64_t> next;
    for (int64_t b = 0; b < B; ++b) next.push_back(sequences[b][lengths[b] + step]);
    batch_logits.push_back(model.forward_cached(ops::from_vector(next, {B, 1}), cache));
  }
  const Tensor batched = ops::cat(batch_logits, 1);  // [B, longest + steps, V]
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    const Tensor alone = model(row_of(sequences[b]));  // [1, length + steps, V]
    const Tensor real = ops::narrow(ops::select(batched, 0, b), 0, padding[b], lengths[b] + steps);
    CHECK(max_scaled_difference(real, ops::select(alone, 0, 0)) <= bound_for(dtype));
  }
}

}  // namespace

TEST_CASE("forward_cached: a GPT's logits are forward's, a causal prefill bit for bit") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    auto model = gpt_model(dtype);
    check_cached_matches_forward(*model, dtype);
  }
}

TEST_CASE("forward_cached: a Llama's (GQA, RoPE at offsets) logits are forward's, a causal prefill bit for bit") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    auto model = llama_model(dtype);
    check_cached_matches_forward(*model, dtype);
  }
}

TEST_CASE("forward_cached: a left-padded batch gives each sequence its own logits (GPT and Llama)") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    check_padded_batch_matches_alone(*gpt_model(dtype), dtype);
    check_padded_batch_matches_alone(*llama_model(dtype), dtype);
  }
}

TEST_CASE("forward_cached: CachedLogits::last is the last row of all, and a batch without padding runs as one") {
  autograd::NoGradGuard no_grad;
  for (auto* make : {&gpt_model, &llama_model}) {
    auto model = make(DType::f32);
    const std::vector<int64_t> a = tokens_of(6, model->vocab_size(), 1), b = tokens_of(6, model->vocab_size(), 2);
    std::vector<int64_t> both(a);
    both.insert(both.end(), b.begin(), b.end());
    nn::KVCache all_cache = model->make_kv_cache(2, 8), last_cache = model->make_kv_cache(2, 8);
    const Tensor all = model->forward_cached(ops::from_vector(both, {2, 6}), all_cache);
    const Tensor last =
        model->forward_cached(ops::from_vector(both, {2, 6}), last_cache, nn::CausalLM::CachedLogits::last);
    CHECK(all.sizes() == Shape{2, 6, model->vocab_size()});
    CHECK(last.sizes() == Shape{2, 1, model->vocab_size()});
    CHECK(max_scaled_difference(last, ops::narrow(all, 1, 5, 1)) <= kCachedF32Bound);
    // A causal prefill of a batch is forward's, bit for bit.
    CHECK(all.to_vector<float>() == model->forward(ops::from_vector(both, {2, 6})).to_vector<float>());
    // Both caches go on alike.
    const Tensor next = ops::from_vector(std::vector<int64_t>{3, 4}, {2, 1});
    CHECK(model->forward_cached(next, last_cache).to_vector<float>() ==
          model->forward_cached(next, all_cache).to_vector<float>());
  }
}

TEST_CASE("RotaryEmbedding::forward_at: forward's rotation at the given positions") {
  nn::RotaryEmbedding rope(8, 16);
  const Tensor x = ops::randn({2, 5, 3, 8}, PhiloxKey{4, 1});
  const Tensor counting = ops::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}, {2, 5});
  CHECK(rope.forward_at(x, counting).to_vector<float>() == rope(x).to_vector<float>());
  // Position p of a sequence: forward's row p of a longer input.
  const Tensor longer = ops::randn({1, 12, 3, 8}, PhiloxKey{4, 2});
  const Tensor rotated = rope(longer);
  const Tensor picked = ops::index_select(longer, 1, ops::from_vector(std::vector<int64_t>{11, 0, 7}, {3}));
  const Tensor at = rope.forward_at(picked, ops::from_vector(std::vector<int64_t>{11, 0, 7}, {1, 3}));
  CHECK(at.to_vector<float>() ==
        ops::index_select(rotated, 1, ops::from_vector(std::vector<int64_t>{11, 0, 7}, {3})).to_vector<float>());
  CHECK_THROWS_WITH_AS(rope.forward_at(x, ops::zeros({2, 4}, {.dtype = DType::i64})),
                       doctest::Contains("positions must be [B, T] = [2, 5] i32/i64, got [2, 4] i64"), Error);
  CHECK_THROWS_WITH_AS(rope.forward_at(x, ops::zeros({2, 5})), doctest::Contains("got [2, 5] f32"), Error);
  CHECK_THROWS_WITH_AS(rope.forward_at(x, ops::full({2, 5}, 16, {.dtype = DType::i64})),
                       doctest::Contains("index 16 at position 0 is out of range for dim 0 of size 16"), Error);
  CHECK_THROWS_WITH_AS(rope.forward_at(ops::zeros({2, 5, 6}), counting),
                       doctest::Contains("expected input [B, T, H, 8]"), Error);
}

TEST_CASE("KVCache: a full cache and positions past block_size are refused; the cache stays usable") {
  autograd::NoGradGuard no_grad;
  auto model = gpt_model(DType::f32);  // block_size 24
  const std::vector<int64_t> tokens = tokens_of(24, model->vocab_size(), 5);
  nn::KVCache small = model->make_kv_cache(1, 10);
  model->forward_cached(row_of({tokens.begin(), tokens.begin() + 8}), small);
  CHECK_THROWS_WITH_AS(model->forward_cached(row_of({tokens.begin() + 8, tokens.begin() + 11}), small),
                       doctest::Contains("the cache is full: 8 of its 10 slots are filled, 3 more tokens do not fit"),
                       Error);
  CHECK(small.length() == 8);
  CHECK_FALSE(small.fits(3, 24));
  CHECK(small.fits(2, 24));
  // The refused step changed nothing: the next two positions are forward's.
  const Tensor expected = model->forward(row_of({tokens.begin(), tokens.begin() + 10}));
  const Tensor next = model->forward_cached(row_of({tokens.begin() + 8, tokens.begin() + 10}), small);
  CHECK(max_scaled_difference(next, ops::narrow(expected, 1, 8, 2)) <= kCachedF32Bound);
  CHECK_THROWS_WITH_AS(model->forward_cached(row_of({1}), small), doctest::Contains("the cache is full"), Error);

  // Padding makes room for slots past block_size, never positions.
  nn::KVCache padded = model->make_kv_cache(2, 30, {3, 0});
  std::vector<int64_t> two_rows(tokens);
  two_rows.insert(two_rows.end(), tokens.begin(), tokens.end());
  model->forward_cached(ops::from_vector(two_rows, {2, 24}), padded);
  CHECK_FALSE(padded.fits(1, 24));
  CHECK_THROWS_WITH_AS(
      model->forward_cached(ops::from_vector(std::vector<int64_t>{1, 2}, {2, 1}), padded),
      doctest::Contains("sequence 1 would reach position 24, but the model has positions [0, 24) (its block_size)"),
      Error);
  CHECK(padded.length() == 24);
  padded.reset({5, 5});
  CHECK(padded.length() == 0);
  CHECK(padded.padding() == std::vector<int64_t>{5, 5});
  CHECK(padded.fits(29, 24));        // positions 0..23 in slots 5..28
  CHECK_FALSE(padded.fits(30, 24));  // 30 slots fit the capacity, but position 24 does not exist
}

TEST_CASE("KVCache and forward_cached: bad arguments are errors that name them") {
  autograd::NoGradGuard no_grad;
  auto gpt = gpt_model(DType::f32);
  auto llama = llama_model(DType::f32);
  nn::KVCache cache = gpt->make_kv_cache(2, 8);
  CHECK(cache.layout() == gpt->kv_cache_layout());
  CHECK(cache.bytes() == 2 * 2 * 2 * 4 * 8 * 8 * 4);  // K and V, 2 layers, B 2, 4 heads, 8 slots, D 8, f32
  CHECK(llama->kv_cache_layout().num_kv_heads == 2);

  const Tensor pair = ops::zeros({2, 1}, {.dtype = DType::i64});
  CHECK_THROWS_WITH_AS(gpt->forward_cached(ops::zeros({2}, {.dtype = DType::i64}), cache),
                       doctest::Contains("GPT::forward_cached: idx must be [B, T] i32/i64, got [2] i64"), Error);
  CHECK_THROWS_WITH_AS(gpt->forward_cached(ops::zeros({2, 1}), cache), doctest::Contains("got [2, 1] f32"), Error);
  CHECK_THROWS_WITH_AS(gpt->forward_cached(Tensor(), cache), doctest::Contains("undefined"), Error);
  CHECK_THROWS_WITH_AS(gpt->forward_cached(ops::zeros({3, 1}, {.dtype = DType::i64}), cache),
                       doctest::Contains("idx has 3 sequences, the cache 2"), Error);
  CHECK_THROWS_WITH_AS(gpt->forward_cached(ops::zeros({2, 0}, {.dtype = DType::i64}), cache),
                       doctest::Contains("a step needs at least one new token, got 0"), Error);
  CHECK_THROWS_WITH_AS(llama->forward_cached(pair, cache),
                       doctest::Contains("Llama::forward_cached: the cache holds 2 layers of 4 kv heads x 8 (f32), the "
                                         "model needs 2 of 2 x 8 (f32): a cache of another model"),
                       Error);
  CHECK_THROWS_WITH_AS(gpt->forward_cached(ops::full({2, 1}, 64, {.dtype = DType::i64}), cache),
                       doctest::Contains("out of range"), Error);
  CHECK(cache.length() == 0);

  const nn::KVCacheLayout layout = gpt->kv_cache_layout();
  CHECK_THROWS_WITH_AS(nn::KVCache(layout, 0, 8, kCPU), doctest::Contains("batch must be positive, got 0"), Error);
  CHECK_THROWS_WITH_AS(nn::KVCache(layout, 2, 0, kCPU), doctest::Contains("capacity must be positive, got 0"), Error);
  CHECK_THROWS_WITH_AS(nn::KVCache(layout, 2, 8, kCPU, {1}),
                       doctest::Contains("padding has 1 entries for a batch of 2 sequences"), Error);
  CHECK_THROWS_WITH_AS(nn::KVCache(layout, 2, 8, kCPU, {0, 8}),
                       doctest::Contains("padding 8 of sequence 1 is outside [0, capacity 8)"), Error);
  CHECK_THROWS_WITH_AS(nn::KVCache(layout, 2, 8, kCPU, {-1, 0}), doctest::Contains("padding -1 of sequence 0"), Error);
  nn::KVCacheLayout integer = layout;
  integer.dtype = DType::i32;
  CHECK_THROWS_WITH_AS(nn::KVCache(integer, 2, 8, kCPU), doctest::Contains("need a floating dtype, got i32"), Error);
  nn::KVCacheLayout empty = layout;
  empty.head_dim = 0;
  CHECK_THROWS_WITH_AS(nn::KVCache(empty, 2, 8, kCPU), doctest::Contains("head_dim (0) must be positive"), Error);

  const nn::CachedStep step = cache.begin_step(1, 24);
  const Tensor kv = ops::zeros({2, 1, 4, 8});
  CHECK_THROWS_WITH_AS(cache.store(2, step, kv, kv), doctest::Contains("KVCache::store: layer 2 is outside [0, 2)"),
                       Error);
  CHECK_THROWS_WITH_AS(cache.store(0, step, ops::zeros({2, 1, 2, 8}), kv),
                       doctest::Contains("keys and values must be [B, T, Hkv, D] = [2, 1, 4, 8], got [2, 1, 2, 8]"),
                       Error);
  CHECK_THROWS_WITH_AS(cache.attend(-1, step, kv), doctest::Contains("KVCache::attend: layer -1"), Error);
  CHECK_THROWS_WITH_AS(cache.attend(0, step, ops::zeros({2, 1, 3, 8})),
                       doctest::Contains("queries must be [B 2, T 1, H (a multiple of 4 kv heads), D 8], got "
                                         "[2, 1, 3, 8]"),
                       Error);
  cache.advance(step);
  CHECK_THROWS_WITH_AS(cache.advance(step), doctest::Contains("the step starts at slot 0, but the cache holds 1"),
                       Error);
  CHECK_THROWS_WITH_AS(cache.store(0, step, kv, kv), doctest::Contains("a step of another cache, or one already"),
                       Error);
  CHECK_THROWS_WITH_AS(cache.begin_step(8, 24), doctest::Contains("1 of its 8 slots are filled, 8 more"), Error);
}

TEST_CASE("forward_cached refuses a model whose blocks have forward hooks it would skip") {
  autograd::NoGradGuard no_grad;
  auto model = gpt_model(DType::f32);
  nn::KVCache cache = model->make_kv_cache(1, 4);
  auto hook = model->blocks()[1].register_forward_pre_hook(
      [](nn::Module&, const nn::TensorList&) -> std::optional<nn::TensorList> { return std::nullopt; });
  CHECK_THROWS_WITH_AS(model->forward_cached(row_of({1, 2}), cache),
                       doctest::Contains("TransformerBlock::forward_cached: TransformerBlock has forward hooks"),
                       Error);
  CHECK(cache.length() == 0);
  hook.remove();
  CHECK(model->forward_cached(row_of({1, 2}), cache).sizes() == Shape{1, 2, 61});
}

TEST_CASE("forward_cached records no graph, whatever the grad mode") {
  auto model = llama_model(DType::f32);
  nn::KVCache cache = model->make_kv_cache(1, 4);
  const Tensor logits = model->forward_cached(row_of({1, 2, 3}), cache);
  CHECK_FALSE(logits.requires_grad());
  CHECK(cache.length() == 3);
}
