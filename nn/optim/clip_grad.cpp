// optim::clip_grad_norm_: a deterministic f64 sum of squares over every
// gradient (fixed blocks, summed in order), summed across the shard groups of
// sharded parameters, then one in-place scale.
#include "nn/optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "autograd/grad_mode.h"
#include "dist/process_group.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

namespace tessera::optim {

namespace {

constexpr int64_t kBlock = 1 << 15;

// Sum of squares in f64, blocks summed in a fixed order so the result does not
// depend on the thread count.
template <typename T>
double sum_of_squares(const T* data, int64_t count) {
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kBlock, last = std::min(count, first + kBlock);
      double sum = 0.0;
      for (int64_t i = first; i < last; ++i) sum += static_cast<double>(data[i]) * static_cast<double>(data[i]);
      partial[static_cast<size_t>(b)] = sum;
    }
  });
  double total = 0.0;
  for (double value : partial) total += value;
  return total;
}

}  // namespace

double clip_grad_norm_(const std::vector<std::shared_ptr<nn::Parameter>>& params, double max_norm) {
  TESSERA_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  std::vector<const nn::Parameter*> owners;
  for (const auto& param : params) {
    TESSERA_CHECK(param != nullptr, "clip_grad_norm_: a parameter is null");
    const Tensor& grad = param->grad();
    if (!grad.defined()) continue;
    TESSERA_CHECK(grad.device().is_cpu(), "clip_grad_norm_: gradients must be on cpu, got {}", grad.device().str());
    TESSERA_CHECK(grad.dtype() == DType::f32 || grad.dtype() == DType::f64,
                  "clip_grad_norm_: gradients must be f32 or f64, got {}", dtype_name(grad.dtype()));
    grads.push_back(grad);
    owners.push_back(param.get());
  }

  // Whole gradients count once; shards are summed per set of shard groups,
  // then across those groups, so every rank gets the same global norm.
  double total = 0.0;
  std::map<std::vector<dist::ProcessGroup*>, std::pair<std::vector<dist::ProcessGroupPtr>, double>> sharded;
  for (size_t index = 0; index < grads.size(); ++index) {
    const Tensor dense = ops::contiguous(grads[index]);
    const double squares = dense.dtype() == DType::f32 ? sum_of_squares(dense.data_ptr<float>(), dense.numel())
                                                        : sum_of_squares(dense.data_ptr<double>(), dense.numel());
    const auto& sharding = owners[index]->sharding();
    if (!sharding) {
      total += squares;
      continue;
    }
    std::vector<dist::ProcessGroupPtr> groups = sharding->shard_groups();
    std::vector<dist::ProcessGroup*> key;
    for (const auto& group : groups) key.push_back(group.get());
    auto& entry = sharded[key];
    entry.first = std::move(groups);
    entry.second += squares;
  }
  for (auto& [key, entry] : sharded) {
    Tensor partial = ops::scalar_tensor(entry.second, {.dtype = DType::f64});
    for (const auto& group : entry.first) group->all_reduce(partial, dist::ReduceOp::sum);
    total += partial.item();
  }
  const double norm = std::sqrt(total);
  const double coefficient = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coefficient < 1.0) {
    for (Tensor grad : grads) ops::mul_(grad, coefficient);
  }
  return norm;
}

}  // namespace tessera::optim
