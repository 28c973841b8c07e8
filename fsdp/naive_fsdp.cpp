#include "fsdp/naive_fsdp.h"

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tessera::fsdp {

namespace {

// [rows, ...] -> [rows_padded, ...]: zero rows appended.
Tensor pad_rows(const Tensor& tensor, int64_t rows_padded) {
  Shape shape = tensor.sizes();
  shape[0] = rows_padded;
  Tensor padded = ops::zeros(shape, {.dtype = tensor.dtype()});
  Tensor rows = ops::slice(padded, 0, 0, tensor.size(0));
  ops::copy_(rows, tensor);
  return padded;
}

// The rows of a whole parameter each rank holds (the last ranks' may be padding only).
int64_t rows_per_rank(const Shape& shape, int ranks) { return (shape[0] + ranks - 1) / ranks; }

}  // namespace

NaiveFSDP::NaiveFSDP(nn::Module& model, dist::ProcessGroupPtr group) : group_(std::move(group)) {
  autograd::NoGradGuard no_grad;  // sharding copies the parameters' values; it is no function of them
  const int ranks = group_->size(), rank = group_->rank();
  for (const auto& [name, whole] : model.named_parameters()) {
    const Tensor& tensor = whole->tensor();
    TESSERA_CHECK(tensor.dim() >= 1 && !tensor.is_meta(),
                  "NaiveFSDP: parameter '{}' of shape {} on {} must have a dim 0 and values (build the model whole)",
                  name, tensor.sizes(), tensor.device().str());
    const int64_t chunk = rows_per_rank(tensor.sizes(), ranks);
    const int64_t first = std::min<int64_t>(rank * chunk, tensor.size(0));
    const int64_t last = std::min<int64_t>(first + chunk, tensor.size(0));
    ShardedParameter sharded{name, whole, tensor.sizes(), {}, {}};
    sharded.padded_shard = pad_rows(ops::slice(tensor, 0, first, last), chunk);
    sharded.shard = std::make_shared<nn::Parameter>(ops::slice(sharded.padded_shard, 0, 0, last - first),
                                                    whole->requires_grad());
    whole->set_tensor(ops::empty({0}, {.dtype = tensor.dtype()}));  // the shard is all this rank keeps
    parameters_.push_back(std::move(sharded));
  }
}

void NaiveFSDP::gather() {
  for (ShardedParameter& parameter : parameters_) {
    Shape padded_shape = parameter.shape;
    padded_shape[0] = parameter.padded_shard.size(0) * group_->size();
    Tensor gathered = ops::empty(padded_shape, {.dtype = parameter.padded_shard.dtype()});
    group_->all_gather_into(gathered, parameter.padded_shard);  // rank r's rows land at r * rows_per_rank
    parameter.whole->set_tensor(ops::slice(gathered, 0, 0, parameter.shape[0]));
  }
}

void NaiveFSDP::reduce_scatter_gradients() {
  for (ShardedParameter& parameter : parameters_) {
    const Tensor& grad = parameter.whole->grad();
    if (grad.defined()) {
      const int64_t chunk = parameter.padded_shard.size(0);
      Tensor shard_grad = ops::empty(parameter.padded_shard.sizes(), {.dtype = grad.dtype()});
      // Every rank reaches this with the same parameter: a parameter forward
      // did not use has a gradient on no rank, and skips the collective on all.
      group_->reduce_scatter_into(shard_grad, pad_rows(grad, chunk * group_->size()), dist::ReduceOp::avg);
      parameter.shard->tensor().set_grad(ops::slice(shard_grad, 0, 0, parameter.shard->tensor().size(0)));
    }
    parameter.whole->set_tensor(ops::empty({0}, {.dtype = parameter.padded_shard.dtype()}));
  }
}

std::vector<nn::NamedParameter> NaiveFSDP::shards() const {
  std::vector<nn::NamedParameter> shards;
  for (const ShardedParameter& parameter : parameters_) shards.push_back({parameter.name, parameter.shard});
  return shards;
}

}  // namespace tessera::fsdp
