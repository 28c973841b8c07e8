// nn::CausalLM: what GPT and Llama share as decoder-only language models, so
// that trainers, FSDP wrapping and generation are written once:
//   {idx} -> logits [B, T, V];  {idx, targets} -> mean cross-entropy (0-d),
//   idx and targets: [B, T] i32/i64 with 1 <= T <= block_size;
//   a padded vocabulary (Vp > V rows in the embedding and head, for aligned
//   GEMMs) stays inside: the loss takes the padded logits with V classes,
//   and {idx} returns the V real columns (a view);
//   blocks(): the repeated layers, fully_shard's usual units;
//   forward_cached(idx_new, cache): incremental decoding with a KVCache
//   (nn/kv_cache.h): the logits of T new tokens per sequence, placed after
//   the ones the cache holds, from their own pass through the model alone.
//   The logits equal forward's on the whole sequence up to rounding (a causal
//   prefill, the cache's first call without padding, gives forward's bits;
//   later steps sum in another order: docs/generation.md gives the bound).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nn/kv_cache.h"
#include "nn/module_list.h"

namespace tessera::nn {

class CausalLM : public Module {
 public:
  Tensor forward_inputs(const TensorList& inputs) final;
  Tensor forward(const Tensor& idx) final;  // logits
  // (*this)({idx, targets}): runs the hooks like any call.
  Tensor loss(const Tensor& idx, const Tensor& targets) { return (*this)(TensorList{idx, targets}); }

  virtual ModuleList& blocks() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The head's output columns: vocab_size() plus padding (none by default).
  virtual int64_t padded_vocab_size() const { return vocab_size(); }
  virtual int64_t block_size() const = 0;
  // What the model's KVCache holds per token.
  virtual KVCacheLayout kv_cache_layout() const = 0;

  // A cache for this model: `batch` sequences of `capacity` slots each, on
  // the parameters' device, with `padding` leading slots of left padding per
  // sequence (empty: none). A step that would take a sequence past position
  // block_size() - 1 is refused, so slots past block_size() + the smallest
  // padding stay unused.
  KVCache make_kv_cache(int64_t batch, int64_t capacity, std::vector<int64_t> padding = {}) const;

  enum class CachedLogits { all, last };
  // idx: [B, T] i32/i64 new tokens (B = cache.batch(), on the cache's device),
  // at the cache's next T slots -> their logits [B, T, V] (all), or the last
  // one's [B, 1, V] (last: what sampling needs, without the head's GEMM over
  // a prompt). Runs without the graph (inference only) and advances the cache.
  // Throws tessera::Error for bad idx, a cache of another model, tokens that
  // would not fit in the cache or past block_size, and hooks it would skip.
  Tensor forward_cached(const Tensor& idx, KVCache& cache, CachedLogits which = CachedLogits::all);

  // Set by a tensor-parallel plan whose head leaves each rank its columns of
  // the padded logits (tp's loss parallel): the loss is computed on those
  // columns, never gathering the logits, and {idx} gathers them.
  struct ShardedLogits {
    // local logits [N, local columns], targets [N] -> the mean loss (0-d), equal on every rank
    std::function<Tensor(const Tensor& local_logits, const Tensor& targets)> loss;
    // [B, T, local columns] -> [B, T, padded_vocab_size()]
    std::function<Tensor(const Tensor& local_logits)> gather;
  };
  void set_sharded_logits(ShardedLogits sharded) { sharded_logits_ = std::move(sharded); }
  bool has_sharded_logits() const { return sharded_logits_.has_value(); }

 protected:
  explicit CausalLM(std::string type_name);
  // idx: [B, T], already checked -> logits [B, T, padded_vocab_size()].
  virtual Tensor logits(const Tensor& idx) = 0;
  // idx: [B, T], checked, at the step's slots -> logits [B, T or 1 (last_only), padded_vocab_size()].
  virtual Tensor cached_logits(const Tensor& idx, KVCache& cache, const CachedStep& step, bool last_only) = 0;

 private:
  std::optional<ShardedLogits> sharded_logits_;
};

}  // namespace tessera::nn
