// First-class hooks, the mechanism FSDP is built on:
//   tensor grad hooks       - see (and may replace) the gradient of a tensor;
//   post-accumulate hooks   - run on a leaf after its .grad was accumulated;
//   node pre-hooks          - run before a node's backward (autograd/node.h);
//   engine-final callbacks  - run once when the backward pass ends (engine.h).
// Each register call returns a handle that removes the hook.
#pragma once

#include <functional>
#include <memory>

#include "autograd/node.h"

namespace tessera::autograd {

class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  // Removes the hook (once; later calls do nothing).
  void remove();

 private:
  std::function<void()> remover_;
};

// Tensor must require grad. For a leaf the hook runs in its AccumulateGrad
// before accumulation; for a non-leaf, when its gradient is complete.
HookHandle register_hook(Tensor& tensor, GradHook hook);
// Tensor must be a leaf that requires grad.
HookHandle register_post_accumulate_grad_hook(Tensor& tensor, PostAccumulateGradHook hook);
HookHandle register_pre_hook(const std::shared_ptr<Node>& node, NodePreHook hook);
// Makes a non-leaf tensor keep its .grad after backward.
void retain_grad(Tensor& tensor);

}  // namespace tessera::autograd
