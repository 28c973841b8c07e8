// optim::clip_grad_norm_: a deterministic f64 sum of squares over every
// gradient (the kernel table's sum_of_squares: fixed blocks, summed in a
// fixed order), summed across the shard groups of sharded parameters, then
// one in-place scale that reads the total where it lives. On cuda the host
// reads one number per step (clip_grad_norm_), or none (clip_grad_norm_tensor).
#include "nn/optim/clip_grad.h"

#include <cmath>
#include <map>
#include <vector>

#include "autograd/grad_mode.h"
#include "dist/process_group.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"

namespace tessera::optim {

namespace {

// The groups over which a parameter's gradient is split into disjoint pieces:
// FSDP's shard groups, and the tp group of a tensor-parallel Shard(d) piece.
// A replicated piece (tp Replicate, HSDP's replicate dim) is counted once.
std::vector<dist::ProcessGroupPtr> shard_groups_of(const nn::Parameter& parameter) {
  std::vector<dist::ProcessGroupPtr> groups;
  if (parameter.sharding()) groups = parameter.sharding()->shard_groups();
  const auto& tensor_parallel = parameter.tensor_parallel();
  if (tensor_parallel && tensor_parallel->shard_dim() >= 0) groups.push_back(tensor_parallel->mesh.group(0));
  return groups;
}

}  // namespace

Tensor clip_grad_norm_tensor(const std::vector<std::shared_ptr<nn::Parameter>>& params, double max_norm) {
  TESSERA_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  std::vector<const nn::Parameter*> owners;
  for (const auto& param : params) {
    TESSERA_CHECK(param != nullptr, "clip_grad_norm_: a parameter is null");
    const Tensor& grad = param->grad();
    if (!grad.defined()) continue;
    TESSERA_CHECK(grad.device().is_cpu() || grad.device().is_cuda(),
                  "clip_grad_norm_: gradients must be on cpu or cuda, got {}", grad.device().str());
    TESSERA_CHECK(grads.empty() || grad.device() == grads.front().device(),
                  "clip_grad_norm_: gradients on {} and {}; clip each device's gradients separately",
                  grads.front().device().str(), grad.device().str());
    TESSERA_CHECK(grad.dtype() == DType::f32 || grad.dtype() == DType::f64,
                  "clip_grad_norm_: gradients must be f32 or f64, got {}", dtype_name(grad.dtype()));
    grads.push_back(grad);
    owners.push_back(param.get());
  }
  if (grads.empty()) return ops::scalar_tensor(0.0, {.dtype = DType::f64});
  const Device device = grads.front().device();
  const KernelTable& table = kernels(device);

  // Whole gradients count once; shards are summed per set of shard groups,
  // then across those groups, so every rank gets the same global norm.
  std::vector<Tensor> whole;
  std::map<std::vector<dist::ProcessGroup*>, std::pair<std::vector<dist::ProcessGroupPtr>, std::vector<Tensor>>>
      sharded;
  std::vector<Tensor> dense(grads.size());
  for (size_t index = 0; index < grads.size(); ++index) {
    dense[index] = ops::contiguous(grads[index]);
    std::vector<dist::ProcessGroupPtr> groups = shard_groups_of(*owners[index]);
    if (groups.empty()) {
      whole.push_back(dense[index]);
      continue;
    }
    std::vector<dist::ProcessGroup*> key;
    for (const auto& group : groups) key.push_back(group.get());
    auto& entry = sharded[key];
    entry.first = std::move(groups);
    entry.second.push_back(dense[index]);
  }
  Tensor total = ops::empty({}, {.dtype = DType::f64, .device = device});
  table.sum_of_squares(total, whole);
  for (auto& [key, entry] : sharded) {
    Tensor partial = ops::empty({}, {.dtype = DType::f64, .device = device});
    table.sum_of_squares(partial, entry.second);
    // Collectives across ranks carry cpu tensors until tessera has NCCL, so
    // there a device's partial sum crosses to the host and back; a group of
    // one rank takes it where it is.
    bool across_ranks = false;
    for (const auto& group : entry.first) across_ranks = across_ranks || group->size() > 1;
    Tensor reduced = across_ranks ? ops::to(partial, kCPU) : partial;
    for (const auto& group : entry.first) group->all_reduce(reduced, dist::ReduceOp::sum);
    total = ops::add(total, ops::to(reduced, device));
  }
  table.scale_to_max_norm(dense, total, max_norm);
  // Non-contiguous gradients were scaled in a copy: write it back.
  for (size_t index = 0; index < grads.size(); ++index) {
    if (!dense[index].is_same(grads[index])) ops::copy_(grads[index], dense[index]);
  }
  return ops::sqrt(total);
}

double clip_grad_norm_(const std::vector<std::shared_ptr<nn::Parameter>>& params, double max_norm) {
  return clip_grad_norm_tensor(params, max_norm).item();  // the one read of the device
}

}  // namespace tessera::optim
