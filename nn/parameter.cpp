// nn::Parameter: the leaf tensor behind a registry slot.
#include "nn/parameter.h"

#include "tensor/host_staging.h"
#include "tensor/ops.h"

namespace tessera::nn {

Tensor padded_shard_buffer(const Shape& padded_shape, DType dtype, Device device, ShardMemory memory) {
  if (device.is_meta() || memory == ShardMemory::device) {
    return ops::empty(padded_shape, {.dtype = dtype, .device = device});
  }
  if (memory == ShardMemory::pinned_host) return pinned_empty(padded_shape, dtype);
  return ops::empty(padded_shape, {.dtype = dtype, .device = kCPU});
}

Parameter::Parameter(Tensor tensor, bool requires_grad) : requires_grad_(requires_grad) {
  set_tensor(std::move(tensor));
}

std::vector<dist::ProcessGroupPtr> ShardingSpec::shard_groups() const {
  std::vector<dist::ProcessGroupPtr> groups;
  for (size_t dim = 0; dim < placements.size(); ++dim) {
    if (std::holds_alternative<dist::Shard>(placements[dim])) groups.push_back(mesh.group(static_cast<int64_t>(dim)));
  }
  return groups;
}

void Parameter::set_tensor(Tensor tensor) {
  TESSERA_CHECK(tensor.defined(), "Parameter: the tensor is undefined");
  TESSERA_CHECK(tensor.is_leaf(), "Parameter: the tensor must be a leaf (it has autograd history); detach it first");
  if (tensor.requires_grad() != requires_grad_) tensor.set_requires_grad(requires_grad_);
  tensor_ = std::move(tensor);
  sharding_.reset();
}

void Parameter::set_tensor(Tensor tensor, std::shared_ptr<const ShardingSpec> sharding) {
  TESSERA_CHECK(sharding != nullptr, "Parameter: the sharding spec is null");
  TESSERA_CHECK(tensor.defined() && tensor.dim() >= 1 && tensor.dim() == static_cast<int64_t>(sharding->global_shape.size()),
                "Parameter: a shard of global shape {} must have as many dims, got {}", sharding->global_shape,
                tensor.defined() ? tensor.sizes() : Shape{});
  for (int64_t dim = 1; dim < tensor.dim(); ++dim) {
    TESSERA_CHECK(tensor.size(dim) == sharding->global_shape[static_cast<size_t>(dim)],
                  "Parameter: a dim-0 shard of {} must keep the other dims, got {}", sharding->global_shape,
                  tensor.sizes());
  }
  TESSERA_CHECK(sharding->row_offset >= 0 && sharding->row_offset + tensor.size(0) <= sharding->global_shape[0] &&
                    tensor.size(0) <= sharding->padded_rows,
                "Parameter: rows [{}, {}) do not fit the global shape {} (padded rows {})", sharding->row_offset,
                sharding->row_offset + tensor.size(0), sharding->global_shape, sharding->padded_rows);
  set_tensor(std::move(tensor));
  sharding_ = std::move(sharding);
}

dist::DTensor Parameter::dtensor() const {
  TESSERA_CHECK(sharding_ != nullptr, "Parameter::dtensor: the parameter is not sharded");
  return dist::DTensor(tensor_.detach(), sharding_->mesh, sharding_->placements, sharding_->global_shape);
}

}  // namespace tessera::nn
