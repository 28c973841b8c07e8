// nn::Embedding: a lookup table initialised N(0, init_std).
#include "nn/embedding.h"

#include "autograd/functions.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace tessera::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options)
    : Module("Embedding"),
      num_embeddings_(num_embeddings),
      num_indexable_(options.padding_rows_from < 0 ? num_embeddings : options.padding_rows_from),
      embedding_dim_(embedding_dim),
      init_std_(options.init_std) {
  TESSERA_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive, got [{}, {}]",
                num_embeddings, embedding_dim);
  TESSERA_CHECK(options.padding_rows_from == -1 ||
                    (options.padding_rows_from >= 1 && options.padding_rows_from <= num_embeddings),
                "Embedding: padding_rows_from must be -1 (no padding) or in [1, {}], got {}", num_embeddings,
                options.padding_rows_from);
  register_parameter("weight", ops::empty({num_embeddings, embedding_dim}, {.dtype = options.dtype, .device = kMeta}));
  materialize(options.device);
}

// Through the rows indices may name, so that an index into the padding is
// refused like any out-of-range index (and the padding gets no gradient).
Tensor Embedding::forward(const Tensor& indices) {
  const Tensor& table = weight().tensor();
  if (num_indexable_ == num_embeddings_) return tessera::embedding(table, indices);
  return tessera::embedding(tessera::narrow(table, 0, 0, num_indexable_), indices);
}

void Embedding::reset_own_parameters(const InitContext& context) {
  // Row i's values depend only on (key, i): the rows before the padding are
  // those of an unpadded table.
  init::normal_(weight(), context.key("weight"), 0.0, init_std_);
  if (num_indexable_ < num_embeddings_) init::zero_rows_(weight(), num_indexable_, num_embeddings_);
}

}  // namespace tessera::nn
