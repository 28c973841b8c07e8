// nn::Embedding: a lookup table initialised N(0, init_std).
#include "nn/embedding.h"

#include <algorithm>

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
  const auto& tensor_parallel = weight().tensor_parallel();
  if (tensor_parallel && tensor_parallel->shard_dim() == 0) return vocab_parallel_lookup(indices);
  const Tensor& table = weight().tensor();
  if (num_indexable_ == num_embeddings_) return tessera::embedding(table, indices);
  return tessera::embedding(tessera::narrow(table, 0, 0, num_indexable_), indices);
}

Tensor Embedding::vocab_parallel_lookup(const Tensor& indices) const {
  TESSERA_CHECK(indices.defined() && (indices.dtype() == DType::i32 || indices.dtype() == DType::i64),
                "Embedding: indices must be i32 or i64, got {}",
                indices.defined() ? dtype_name(indices.dtype()) : "an undefined tensor");
  // Every rank sees every index: each is checked against the whole table
  // (read on the host, a device sync on a GPU), as the unsharded lookup would.
  const std::vector<int64_t> values = ops::to(ops::to(indices, kCPU), DType::i64).to_vector<int64_t>();
  for (size_t i = 0; i < values.size(); ++i) {
    TESSERA_CHECK(values[i] >= 0 && values[i] < num_indexable_,
                  "Embedding: index {} at position {} is outside the {} rows indices may name", values[i], i,
                  num_indexable_);
  }
  const TensorParallelSpec& spec = *weight().tensor_parallel();
  TESSERA_CHECK(spec.sections == 1, "Embedding: rows split into {} sections ({}); a table's rows are one range",
                spec.sections, spec.to_string());
  const dist::ShardExtent box = spec.boxes(spec.mesh.coordinate(0)).front();
  const int64_t held = std::clamp<int64_t>(num_indexable_ - box.offset, 0, box.length);  // this piece less padding
  Shape out_shape = indices.sizes();
  out_shape.push_back(embedding_dim_);
  const Tensor& table = weight().tensor();
  if (held == 0) return ops::zeros(out_shape, {.dtype = table.dtype(), .device = table.device()});
  const Tensor in_box = ops::masked_fill(ops::lt(indices, static_cast<double>(box.offset + held)),
                                         ops::lt(indices, static_cast<double>(box.offset)), 0.0);
  // Indices elsewhere read row 0 of the piece, and the mask zeroes them (and
  // their gradient).
  const Tensor local_indices =
      ops::masked_fill(ops::sub(indices, static_cast<double>(box.offset)), ops::logical_not(in_box), 0.0);
  const Tensor rows = tessera::embedding(tessera::narrow(table, 0, 0, held), local_indices);
  return tessera::mul(rows, ops::expand(ops::unsqueeze(ops::to(in_box, table.dtype()), -1), out_shape));
}

void Embedding::reset_own_parameters(const InitContext& context) {
  // Row i's values depend only on (key, i): the rows before the padding are
  // those of an unpadded table.
  init::normal_(weight(), context.key("weight"), 0.0, init_std_);
  if (num_indexable_ < num_embeddings_) init::zero_rows_(weight(), num_indexable_, num_embeddings_);
}

}  // namespace tessera::nn
