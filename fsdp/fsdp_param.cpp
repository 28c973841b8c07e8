// fsdp::FSDPParam: dim-0 sharding of one parameter and the swap between its
// sharded and unsharded faces.
#include "fsdp/fsdp_param.h"

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::fsdp {

int64_t padded_shard_rows(int64_t rows, int64_t shards) {
  TESSERA_CHECK(rows >= 0, "padded_shard_rows: rows must be >= 0, got {}", rows);
  TESSERA_CHECK(shards >= 1, "padded_shard_rows: shards must be >= 1, got {}", shards);
  return rows / shards + (rows % shards != 0 ? 1 : 0);  // ceil, without overflow
}

FSDPParam::FSDPParam(std::string fqn, std::shared_ptr<nn::Parameter> param, const dist::DeviceMesh& mesh,
                     nn::ShardMemory memory)
    : fqn_(std::move(fqn)), param_(std::move(param)), dtype_(param_->tensor().dtype()) {
  const Tensor full = param_->tensor();
  // fully_shard has checked the parameter (floating, dim >= 1) and the mesh (1-D or 2-D).
  // The shard dim is the mesh's last; a 2-D mesh replicates along its first (HSDP).
  const int64_t shard_dim = mesh.ndim() - 1;
  const int64_t shards = mesh.size(shard_dim);
  const Shape global_shape = full.sizes();
  const int64_t rows = global_shape[0];
  const dist::ShardExtent extent = dist::shard_extent(rows, shards, mesh.coordinate(shard_dim));
  for (size_t dim = 1; dim < global_shape.size(); ++dim) row_numel_ *= global_shape[dim];

  auto spec = std::make_shared<nn::ShardingSpec>();
  spec->mesh = mesh;
  spec->placements = mesh.ndim() == 1 ? dist::Placements{dist::Shard{0}}
                                      : dist::Placements{dist::Replicate{}, dist::Shard{0}};
  spec->global_shape = global_shape;
  spec->row_offset = extent.offset;
  spec->padded_rows = padded_shard_rows(rows, shards);
  spec->memory = memory;
  spec_ = spec;

  Shape padded_shape = global_shape;
  padded_shape[0] = spec->padded_rows;
  Tensor padded = nn::padded_shard_buffer(padded_shape, full.dtype(), full.device(), memory);
  Tensor local = ops::narrow(padded, 0, 0, extent.length);
  if (!full.is_meta()) {
    autograd::NoGradGuard no_grad;  // the shard is a copy, not a function of the parameter
    ops::copy_(local, ops::narrow(full, 0, extent.offset, extent.length));
    if (extent.length < spec->padded_rows) {
      Tensor padding = ops::narrow(padded, 0, extent.length, spec->padded_rows - extent.length);
      ops::zero_(padding);
    }
  }
  param_->set_tensor(std::move(local), spec_);
}

int64_t FSDPParam::local_rows() const { return sharded().size(0); }

const Tensor& FSDPParam::sharded() const { return holds_unsharded_ ? sharded_ : param_->tensor(); }

Tensor FSDPParam::padded_sharded() const {
  const Tensor& shard = sharded();
  Shape padded_shape = global_shape();
  padded_shape[0] = padded_rows();
  return Tensor::make(shard.storage(), padded_shape, contiguous_strides(padded_shape), shard.storage_offset(),
                      shard.dtype());
}

dist::DTensor FSDPParam::sharded_dtensor() const {
  return dist::DTensor(sharded().detach(), spec_->mesh, spec_->placements, spec_->global_shape);
}

void FSDPParam::init_unsharded(DType param_dtype, Device device) {
  const Tensor& shard = sharded();
  TESSERA_CHECK(!shard.is_meta(), "fsdp: parameter '{}' is still on meta; call to_empty(device) and "
                "reset_parameters() after fully_shard and before the first forward", fqn_);
  // An all-gather extension may unshard into another shape and dtype (NF4's
  // bytes into a matrix).
  const auto& extension = param_->all_gather_extension();
  const Shape shape = extension ? extension->unsharded_shape(global_shape()) : global_shape();
  const DType dtype = extension ? extension->unsharded_dtype(param_dtype) : param_dtype;
  auto storage = Storage::released(device, shape_numel(shape) * static_cast<int64_t>(element_size(dtype)));
  unsharded_ = Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
  if (param_->requires_grad()) unsharded_.set_requires_grad(true);
}

void FSDPParam::alloc_unsharded() { unsharded_.storage()->restore_data(); }

void FSDPParam::free_unsharded() { unsharded_.storage()->release_data(); }

void FSDPParam::to_unsharded() {
  if (holds_unsharded_) return;
  sharded_ = param_->tensor();
  param_->set_tensor(unsharded_);
  holds_unsharded_ = true;
}

void FSDPParam::to_sharded() {
  if (!holds_unsharded_) return;
  param_->set_tensor(sharded_, spec_);
  sharded_ = Tensor();
  holds_unsharded_ = false;
}

}  // namespace tessera::fsdp
