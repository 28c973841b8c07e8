// Graph nodes, the edges between them, and AccumulateGrad, the sink that
// turns the gradient of a leaf into its .grad. Recording an op costs one node
// allocation and its edge vector; nothing else is allocated per op.
#include "autograd/node.h"

#include <algorithm>
#include <atomic>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::autograd {

namespace {

// Per thread, like grad mode: each simulated rank records its own graph, and
// ordering only matters within one graph.
thread_local uint64_t next_sequence_nr = 0;

// Hook ids are unique process-wide so that a handle never removes a hook that
// another thread registered.
std::atomic<int64_t> next_hook_id{1};

int64_t new_hook_id() { return next_hook_id.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

Node::Node() : sequence_nr_(next_sequence_nr++) {}

void Node::release() {
  release_saved_tensors();
  next_edges_.clear();
  next_edges_.shrink_to_fit();
  released_ = true;
}

int64_t Node::add_pre_hook(NodePreHook hook) {
  const int64_t id = new_hook_id();
  pre_hooks_.emplace_back(id, std::move(hook));
  return id;
}

bool Node::remove_pre_hook(int64_t handle) {
  auto it = std::find_if(pre_hooks_.begin(), pre_hooks_.end(), [&](const auto& entry) { return entry.first == handle; });
  if (it == pre_hooks_.end()) return false;
  pre_hooks_.erase(it);
  return true;
}

int64_t Node::add_output_hook(uint32_t output_nr, GradHook hook) {
  TESSERA_CHECK(output_nr < num_outputs_, "add_output_hook: {} has {} outputs, asked for output {}", name(),
                num_outputs_, output_nr);
  const int64_t id = new_hook_id();
  output_hooks_.emplace_back(id, output_nr, std::move(hook));
  return id;
}

bool Node::remove_output_hook(int64_t handle) {
  auto it = std::find_if(output_hooks_.begin(), output_hooks_.end(),
                         [&](const auto& entry) { return std::get<0>(entry) == handle; });
  if (it == output_hooks_.end()) return false;
  output_hooks_.erase(it);
  return true;
}

Edge gradient_edge(const Tensor& tensor) {
  if (!tensor.defined()) return {};
  AutogradMeta* meta = tensor.impl()->autograd.get();
  if (meta == nullptr) return {};
  if (meta->grad_fn) return {meta->grad_fn, meta->output_nr};
  if (!meta->requires_grad) return {};
  // One AccumulateGrad per leaf while any graph holds it, so that every use of
  // the leaf in a graph meets in one node (and its hooks run once).
  std::shared_ptr<Node> accumulator = meta->grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(tensor.impl_ptr());
    meta->grad_accumulator = accumulator;
  }
  return {std::move(accumulator), 0};
}

bool any_requires_grad(std::initializer_list<const Tensor*> tensors) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* tensor : tensors) {
    if (tensor->defined() && tensor->requires_grad()) return true;
  }
  return false;
}

bool any_requires_grad(const TensorList& tensors) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& tensor : tensors) {
    if (tensor.defined() && tensor.requires_grad()) return true;
  }
  return false;
}

void set_history(Tensor& output, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  // A fresh op result has no autograd slot yet. One that has one is an input
  // handed back unchanged (contiguous(), reshape to the same shape, a custom
  // forward returning its input): give the output its own handle so the
  // input keeps its history.
  if (output.impl()->autograd) output = output.detach();
  AutogradMeta& meta = output.autograd_meta();
  meta.grad_fn = node;
  meta.output_nr = output_nr;
}

AccumulateGrad::AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}

Tensor AccumulateGrad::leaf() const { return Tensor(leaf_.lock()); }

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  Tensor leaf = this->leaf();
  if (!leaf.defined() || grad_outputs.empty() || !grad_outputs[0].defined()) return {};
  Tensor grad = std::move(grad_outputs[0]);
  AutogradMeta& meta = leaf.autograd_meta();

  if (!meta.grad_hooks.empty()) {
    auto hooks = meta.grad_hooks;  // a hook may remove itself
    for (auto& [id, hook] : hooks) {
      Tensor replaced = hook(grad);
      if (replaced.defined()) grad = std::move(replaced);
    }
  }
  TESSERA_CHECK(grad.sizes() == leaf.sizes(), "AccumulateGrad: gradient of shape {} for a leaf of shape {}",
                grad.sizes(), leaf.sizes());

  if (!meta.grad.defined()) {
    // Steal the buffer when nobody else can see it; otherwise .grad would
    // alias a tensor that its owner may still change.
    const bool exclusive = grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1;
    if (exclusive && grad.is_contiguous() && grad.dtype() == leaf.dtype() && !grad.impl()->autograd) {
      meta.grad = std::move(grad);
    } else {
      meta.grad = grad.dtype() == leaf.dtype() ? ops::clone(grad) : ops::to(grad, leaf.dtype());
    }
  } else {
    ops::add_(meta.grad, grad);
  }

  if (!meta.post_accumulate_grad_hooks.empty()) {
    auto hooks = meta.post_accumulate_grad_hooks;
    for (auto& [id, hook] : hooks) hook(leaf);
  }
  return {};
}

}  // namespace tessera::autograd
