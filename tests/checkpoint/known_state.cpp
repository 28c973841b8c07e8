// Known values for the kill tests.
#include "tests/checkpoint/known_state.h"

#include "tensor/ops.h"

namespace tessera::checkpoint::testing {

namespace {

constexpr int64_t kColumns = 256;

Tensor values(int64_t step, const Shape& shape, DType dtype) {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  std::vector<double> data(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = static_cast<double>(step * 1000 + i % 997);
  return ops::to(ops::from_vector(data, shape), dtype);
}

DistributedStateDict layout(const dist::ProcessGroupPtr& group, const Tensor& weights, const Tensor& bias) {
  DistributedStateDict state;
  state["bias"] = bias;
  if (!group) {
    state["weights"] = weights;
  } else {
    const dist::DeviceMesh mesh(group, kCPU, {group->size()});
    state["weights"] = dist::distribute(weights, mesh, {dist::Shard{0}});
  }
  return state;
}

}  // namespace

DistributedStateDict known_state(const dist::ProcessGroupPtr& group, int64_t step, int64_t rows) {
  return layout(group, values(step, {rows, kColumns}, DType::f32), values(step, {rows}, DType::f64));
}

DistributedStateDict zero_state(const dist::ProcessGroupPtr& group, int64_t rows) {
  return layout(group, ops::zeros({rows, kColumns}), ops::zeros({rows}, {.dtype = DType::f64}));
}

DistributedStateDict zeros_like_state(const DistributedStateDict& state) {
  DistributedStateDict zeros;
  for (const auto& [name, entry] : state) {
    if (const Tensor* tensor = std::get_if<Tensor>(&entry)) {
      zeros[name] = ops::zeros_like(*tensor);
      continue;
    }
    const auto& dtensor = std::get<dist::DTensor>(entry);
    zeros[name] = dist::DTensor(ops::zeros_like(dtensor.local()), dtensor.mesh(), dtensor.placements(),
                                dtensor.global_shape());
  }
  return zeros;
}

std::string check_known_state(const DistributedStateDict& state, int64_t step) {
  for (const auto& [name, entry] : state) {
    const Tensor local = std::holds_alternative<Tensor>(entry) ? std::get<Tensor>(entry)
                                                               : std::get<dist::DTensor>(entry).full_tensor();
    const Tensor expected = values(step, local.sizes(), local.dtype());
    if (local.to_vector<double>() != expected.to_vector<double>()) return name + " differs from step " + std::to_string(step);
  }
  return "";
}

}  // namespace tessera::checkpoint::testing
