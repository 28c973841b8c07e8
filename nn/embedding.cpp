// nn::Embedding: a lookup table initialised N(0, init_std).
#include "nn/embedding.h"

#include "autograd/functions.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace tessera::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim), init_std_(options.init_std) {
  TESSERA_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive, got [{}, {}]",
                num_embeddings, embedding_dim);
  register_parameter("weight", ops::empty({num_embeddings, embedding_dim}, {.dtype = options.dtype, .device = kMeta}));
  materialize(options.device);
}

Tensor Embedding::forward(const Tensor& indices) { return tessera::embedding(weight().tensor(), indices); }

void Embedding::reset_own_parameters(const InitContext& context) {
  init::normal_(weight(), context.key("weight"), 0.0, init_std_);
}

}  // namespace tessera::nn
