// optim::clip_grad_norm_: a deterministic f64 sum of squares over every
// gradient (the kernel table's sum_of_squares: fixed blocks, summed in a
// fixed order), summed across the shard groups of sharded parameters, then
// one in-place scale that reads the total where it lives. On cuda the host
// reads one number per step: the total, after the scale was queued.
#include "nn/optim/clip_grad.h"

#include <cmath>
#include <map>
#include <vector>

#include "autograd/grad_mode.h"
#include "dist/process_group.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"

namespace tessera::optim {

double clip_grad_norm_(const std::vector<std::shared_ptr<nn::Parameter>>& params, double max_norm) {
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
  if (grads.empty()) return 0.0;
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
    const auto& sharding = owners[index]->sharding();
    if (!sharding) {
      whole.push_back(dense[index]);
      continue;
    }
    std::vector<dist::ProcessGroupPtr> groups = sharding->shard_groups();
    std::vector<dist::ProcessGroup*> key;
    for (const auto& group : groups) key.push_back(group.get());
    auto& entry = sharded[key];
    entry.first = std::move(groups);
    entry.second.push_back(dense[index]);
  }
  Tensor total = ops::empty({}, {.dtype = DType::f64, .device = device});
  table.sum_of_squares(total, whole);
  if (!sharded.empty()) {
    // Collectives run on cpu tensors today, so a device's partial sums cross
    // to the host for the all-reduce and the total goes back: one round trip
    // per step that an unsharded model does not make.
    double sum = ops::to(total, kCPU).item();
    for (auto& [key, entry] : sharded) {
      Tensor partial = ops::empty({}, {.dtype = DType::f64, .device = device});
      table.sum_of_squares(partial, entry.second);
      partial = ops::to(partial, kCPU);
      for (const auto& group : entry.first) group->all_reduce(partial, dist::ReduceOp::sum);
      sum += partial.item();
    }
    total = ops::to(ops::scalar_tensor(sum, {.dtype = DType::f64}), device);
  }
  table.scale_to_max_norm(dense, total, max_norm);
  // The one read of the step (a device waits for the scale's queue position).
  const double norm = std::sqrt(ops::to(total, kCPU).item());
  // Non-contiguous gradients were scaled in a copy: write it back.
  for (size_t index = 0; index < grads.size(); ++index) {
    if (!dense[index].is_same(grads[index])) ops::copy_(grads[index], dense[index]);
  }
  return norm;
}

}  // namespace tessera::optim
