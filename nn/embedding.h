// nn::Embedding: a lookup table weight: [num_embeddings, dim]; indices of any
// shape (i32/i64) -> [..., dim].
#pragma once

#include "nn/module.h"

namespace tessera::nn {

struct EmbeddingOptions {
  double init_std = 1.0;  // W ~ N(0, init_std); torch's default is 1, GPT-2 uses 0.02
  // Rows from here on are padding (a padded vocabulary): initialised to
  // zero, and no index may reach them. -1: every row is an embedding.
  int64_t padding_rows_from = -1;
  Device device = kCPU;
  DType dtype = DType::f32;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});

  // indices: [...] -> [..., dim]. When tensor parallelism gave this rank a
  // piece of the rows (tp's vocabulary-parallel style), only the indices
  // that fall in it are looked up and the others give zero rows: the result
  // is this rank's term of a sum over the tp group, which the style sums.
  Tensor forward(const Tensor& indices) override;

  // All rows, padding included (the weight's dim 0).
  int64_t num_embeddings() const { return num_embeddings_; }
  // The rows indices may name: num_embeddings() less the padding.
  int64_t num_indexable() const { return num_indexable_; }
  int64_t embedding_dim() const { return embedding_dim_; }
  Parameter& weight() const { return *parameter("weight"); }

 protected:
  void reset_own_parameters(const InitContext& context) override;

 private:
  Tensor vocab_parallel_lookup(const Tensor& indices) const;

  int64_t num_embeddings_;
  int64_t num_indexable_;
  int64_t embedding_dim_;
  double init_std_;
};

}  // namespace tessera::nn
