// One all-reduce (max) of every float8 weight's amax per group they are split over.
#include "fsdp/float8_scales.h"

#include <algorithm>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/float8_all_gather.h"
#include "tensor/ops.h"

namespace tessera::fsdp {

namespace {

// The groups whose ranks hold different pieces of `parameter`.
std::vector<dist::ProcessGroupPtr> groups_splitting(const nn::Parameter& parameter) {
  std::vector<dist::ProcessGroupPtr> groups;
  if (const auto& sharding = parameter.sharding()) groups = sharding->shard_groups();
  if (const auto& pieces = parameter.tensor_parallel()) groups.push_back(pieces->mesh.group(0));
  return groups;
}

}  // namespace

int64_t precompute_float8_scales(nn::Module& root) {
  autograd::NoGradGuard no_grad;
  // Weights split over the same groups share one all-reduce. Buckets are
  // kept in the order the parameters are met, which every rank shares (an
  // order by address would not be).
  struct Bucket {
    std::vector<dist::ProcessGroupPtr> groups;
    std::vector<nn::Float8WeightScale*> scales;
    std::vector<Tensor> amaxes;
  };
  std::vector<Bucket> buckets;
  for (const auto& [name, parameter] : root.named_parameters()) {
    const auto extension = std::dynamic_pointer_cast<nn::Float8AllGather>(parameter->all_gather_extension());
    if (!extension) continue;
    const std::vector<dist::ProcessGroupPtr> groups = groups_splitting(*parameter);
    auto bucket = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) { return b.groups == groups; });
    if (bucket == buckets.end()) bucket = buckets.insert(buckets.end(), Bucket{groups, {}, {}});
    bucket->scales.push_back(extension->scale().get());
    bucket->amaxes.push_back(ops::float8_amax(parameter->tensor().detach()));
  }
  int64_t scaled = 0;
  for (Bucket& bucket : buckets) {
    Tensor amaxes = ops::stack(bucket.amaxes, 0);
    for (const dist::ProcessGroupPtr& group : bucket.groups) group->all_reduce(amaxes, dist::ReduceOp::max);
    for (size_t index = 0; index < bucket.scales.size(); ++index) {
      bucket.scales[index]->scale =
          ops::float8_scale_from_amax(ops::select(amaxes, 0, static_cast<int64_t>(index)), DType::f8e4m3);
      ++scaled;
    }
  }
  return scaled;
}

}  // namespace tessera::fsdp
