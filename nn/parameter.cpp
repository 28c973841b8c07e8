// nn::Parameter: the leaf tensor behind a registry slot.
#include "nn/parameter.h"

#include <fmt/format.h>

#include "dist/process_group.h"
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

int64_t TensorParallelSpec::shard_dim() const {
  const auto* shard = std::get_if<dist::Shard>(&placement);
  return shard ? shard->dim : -1;
}

std::vector<dist::ShardExtent> TensorParallelSpec::boxes(int64_t rank) const {
  const int64_t dim = shard_dim();
  if (dim < 0) return {{0, global_shape.empty() ? 1 : global_shape[0]}};
  const int64_t section_size = global_shape[static_cast<size_t>(dim)] / sections;
  std::vector<dist::ShardExtent> held;
  for (int64_t section = 0; section < sections; ++section) {
    const dist::ShardExtent piece = dist::shard_extent(section_size, mesh.size(), rank);
    held.push_back({section * section_size + piece.offset, piece.length});
  }
  return held;
}

Shape TensorParallelSpec::local_shape(int64_t rank) const {
  Shape shape = global_shape;
  const int64_t dim = shard_dim();
  if (dim < 0) return shape;
  int64_t rows = 0;
  for (const dist::ShardExtent& box : boxes(rank)) rows += box.length;
  shape[static_cast<size_t>(dim)] = rows;
  return shape;
}

std::vector<TensorParallelSpec::RowRun> TensorParallelSpec::logical_rows(int64_t first_row, int64_t rows,
                                                                         int64_t rank) const {
  if (shard_dim() != 0) return {{0, rows, first_row}};
  std::vector<RowRun> runs;
  int64_t piece_row = 0;  // where the box starts in the piece
  for (const dist::ShardExtent& box : boxes(rank)) {
    const int64_t begin = std::max(first_row, piece_row);
    const int64_t end = std::min(first_row + rows, piece_row + box.length);
    if (begin < end) runs.push_back({begin - first_row, end - begin, box.offset + begin - piece_row});
    piece_row += box.length;
  }
  return runs;
}

std::string TensorParallelSpec::to_string() const {
  const std::string over = fmt::format("over {} ({} ranks)", mesh.dim_names().empty() ? "tp" : mesh.dim_names()[0],
                                       mesh.size());
  if (shard_dim() < 0) {
    return fmt::format("Replicate() of {}{} {}", global_shape, partial_gradient ? " with partial gradients" : "",
                       over);
  }
  if (sections == 1) return fmt::format("{} of {} {}", dist::placement_name(placement), global_shape, over);
  return fmt::format("{} of {} in {} sections {}", dist::placement_name(placement), global_shape, sections, over);
}

Tensor TensorParallelSpec::gather(const Tensor& local_tensor) const {
  const Tensor local = local_tensor.detach();
  const Shape mine = local_shape(mesh.coordinate(0));
  TESSERA_CHECK(local.sizes() == mine,
                "TensorParallelSpec::gather: a tensor of shape {} is not this rank's piece of {} (shape {})",
                local.sizes(), to_string(), mine);
  const int64_t dim = shard_dim();
  if (dim < 0) return ops::clone(local);
  Shape section_shape = global_shape;
  section_shape[static_cast<size_t>(dim)] /= sections;
  std::vector<Tensor> whole_sections;
  int64_t local_offset = 0;
  for (const dist::ShardExtent& box : boxes(mesh.coordinate(0))) {
    const Tensor piece = ops::contiguous(ops::narrow(local, dim, local_offset, box.length));
    whole_sections.push_back(dist::DTensor(piece, mesh, {dist::Shard{dim}}, section_shape).full_tensor());
    local_offset += box.length;
  }
  return whole_sections.size() == 1 ? whole_sections.front() : ops::cat(whole_sections, dim);
}

const Shape& Parameter::global_shape() const {
  if (tensor_parallel_) return tensor_parallel_->global_shape;
  return sharding_ ? sharding_->global_shape : tensor_.sizes();
}

void Parameter::set_tensor_parallel(Tensor local, std::shared_ptr<const TensorParallelSpec> spec) {
  TESSERA_CHECK(spec != nullptr, "Parameter: the tensor-parallel spec is null");
  TESSERA_CHECK(spec->mesh.ndim() == 1, "Parameter: tensor parallelism takes a 1-D mesh, got {}",
                spec->mesh.to_string());
  TESSERA_CHECK(sharding_ == nullptr,
                "Parameter: already sharded by FSDP; apply tensor parallelism first, then fully_shard");
  TESSERA_CHECK(tensor_parallel_ == nullptr, "Parameter: already laid out for tensor parallelism as {}",
                tensor_parallel_ ? tensor_parallel_->to_string() : "");
  const int64_t dim = spec->shard_dim();
  TESSERA_CHECK(dim < static_cast<int64_t>(spec->global_shape.size()) && spec->sections >= 1 &&
                    (dim < 0 || spec->global_shape[static_cast<size_t>(dim)] % spec->sections == 0),
                "Parameter: {} does not fit (the sharded dim must exist and split into equal sections)",
                spec->to_string());
  const Shape expected = spec->local_shape(spec->mesh.coordinate(0));
  TESSERA_CHECK(local.defined() && local.sizes() == expected,
                "Parameter: tp rank {} of {} must hold a piece of shape {}, got {}", spec->mesh.coordinate(0),
                spec->to_string(), expected, local.defined() ? local.sizes() : Shape{});
  replace_leaf(std::move(local));
  tensor_parallel_ = std::move(spec);
  if (tensor_parallel_->partial_gradient && requires_grad_) set_sums_partial_gradient(true);
}

void Parameter::set_sums_partial_gradient(bool sums) {
  TESSERA_CHECK(!sums || (tensor_parallel_ && tensor_parallel_->partial_gradient),
                "Parameter::set_sums_partial_gradient: the parameter has no partial gradients to sum");
  if (sums == sums_partial_gradient()) return;
  if (!sums) {
    partial_gradient_sum_->remove();
    partial_gradient_sum_.reset();
    return;
  }
  // The group is looked up when a gradient arrives: a planning mesh (no
  // groups) lays out models that never run backward.
  partial_gradient_sum_ = register_gradient_hook([mesh = tensor_parallel_->mesh](const Tensor& grad) {
    Tensor summed = ops::clone(grad);
    mesh.group(0)->all_reduce(summed, dist::ReduceOp::sum);
    return summed;
  });
}

void Parameter::set_requires_grad(bool requires_grad) {
  if (requires_grad == requires_grad_) return;
  TESSERA_CHECK(!is_sharded(), "Parameter: requires_grad cannot change once FSDP has sharded the parameter (its "
                "gradient slots are laid out); freeze or thaw it before fully_shard");
  TESSERA_CHECK(!requires_grad || is_floating(tensor_.dtype()),
                "Parameter: only a floating parameter can require grad, this one is {}", dtype_name(tensor_.dtype()));
  requires_grad_ = requires_grad;
  if (!requires_grad) tensor_.set_grad(Tensor());
  replace_leaf(tensor_);  // sets the flag on the tensor and moves the gradient hooks on or off it
}

void Parameter::replace_leaf(Tensor tensor) {
  TESSERA_CHECK(tensor.defined(), "Parameter: the tensor is undefined");
  TESSERA_CHECK(tensor.is_leaf(), "Parameter: the tensor must be a leaf (it has autograd history); detach it first");
  if (tensor.requires_grad() != requires_grad_) tensor.set_requires_grad(requires_grad_);
  tensor_ = std::move(tensor);
  for (GradientHook& entry : *gradient_hooks_) {
    entry.on_tensor.remove();
    if (tensor_.requires_grad()) entry.on_tensor = autograd::register_hook(tensor_, entry.hook);
  }
}

autograd::HookHandle Parameter::register_gradient_hook(GradHook hook) {
  TESSERA_CHECK(requires_grad_, "Parameter::register_gradient_hook: the parameter does not require grad");
  const int64_t id = next_gradient_hook_id_++;
  autograd::HookHandle on_tensor = autograd::register_hook(tensor_, hook);
  gradient_hooks_->push_back({id, std::move(hook), std::move(on_tensor)});
  std::weak_ptr<std::vector<GradientHook>> weak = gradient_hooks_;
  return autograd::HookHandle([weak, id] {
    auto hooks = weak.lock();
    if (!hooks) return;
    for (auto it = hooks->begin(); it != hooks->end(); ++it) {
      if (it->id != id) continue;
      it->on_tensor.remove();
      hooks->erase(it);
      return;
    }
  });
}

void Parameter::set_tensor(Tensor tensor) {
  if (tensor_parallel_ && tensor.defined()) {
    const Shape piece = tensor_parallel_->local_shape(tensor_parallel_->mesh.coordinate(0));
    TESSERA_CHECK(tensor.sizes() == piece, "Parameter: holds the tensor-parallel piece {} of {}, got a tensor of {}",
                  piece, tensor_parallel_->to_string(), tensor.sizes());
  }
  replace_leaf(std::move(tensor));
  sharding_.reset();
}

void Parameter::set_tensor(Tensor tensor, std::shared_ptr<const ShardingSpec> sharding) {
  TESSERA_CHECK(sharding != nullptr, "Parameter: the sharding spec is null");
  TESSERA_CHECK(tensor.defined() && tensor.dim() >= 1 &&
                    tensor.dim() == static_cast<int64_t>(sharding->global_shape.size()),
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
  replace_leaf(std::move(tensor));
  sharding_ = std::move(sharding);
}

dist::DTensor Parameter::dtensor() const {
  TESSERA_CHECK(sharding_ != nullptr, "Parameter::dtensor: the parameter is not sharded");
  return dist::DTensor(tensor_.detach(), sharding_->mesh, sharding_->placements, sharding_->global_shape);
}

}  // namespace tessera::nn
