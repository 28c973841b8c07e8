// Registration of the hooks that the engine runs. A handle holds only weak
// references, so keeping a handle never keeps a tensor or a graph alive.
#include "autograd/hooks.h"

#include <algorithm>
#include <atomic>

#include "tensor/ops.h"

namespace tessera::autograd {

namespace {

std::atomic<int64_t> next_leaf_hook_id{1};

template <typename List>
void erase_id(List& list, int64_t id) {
  list.erase(std::remove_if(list.begin(), list.end(), [&](const auto& entry) { return entry.first == id; }),
             list.end());
}

}  // namespace

void HookHandle::remove() {
  if (!remover_) return;
  std::function<void()> remover = std::move(remover_);
  remover_ = nullptr;
  remover();
}

HookHandle register_hook(Tensor& tensor, GradHook hook) {
  TESSERA_CHECK(tensor.defined() && tensor.requires_grad(),
                "register_hook: the tensor does not require grad, so no gradient will reach a hook");
  if (tensor.is_leaf()) {
    const int64_t id = next_leaf_hook_id.fetch_add(1, std::memory_order_relaxed);
    tensor.autograd_meta().grad_hooks.emplace_back(id, std::move(hook));
    std::weak_ptr<TensorImpl> weak = tensor.impl_ptr();
    return HookHandle([weak, id] {
      if (auto impl = weak.lock(); impl && impl->autograd) erase_id(impl->autograd->grad_hooks, id);
    });
  }
  const std::shared_ptr<Node>& node = tensor.grad_fn();
  const int64_t id = node->add_output_hook(tensor.output_nr(), std::move(hook));
  std::weak_ptr<Node> weak = node;
  return HookHandle([weak, id] {
    if (auto locked = weak.lock()) locked->remove_output_hook(id);
  });
}

HookHandle register_post_accumulate_grad_hook(Tensor& tensor, PostAccumulateGradHook hook) {
  TESSERA_CHECK(tensor.defined() && tensor.is_leaf() && tensor.requires_grad(),
                "register_post_accumulate_grad_hook: only a leaf that requires grad accumulates a .grad");
  const int64_t id = next_leaf_hook_id.fetch_add(1, std::memory_order_relaxed);
  tensor.autograd_meta().post_accumulate_grad_hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<TensorImpl> weak = tensor.impl_ptr();
  return HookHandle([weak, id] {
    if (auto impl = weak.lock(); impl && impl->autograd) erase_id(impl->autograd->post_accumulate_grad_hooks, id);
  });
}

HookHandle register_pre_hook(const std::shared_ptr<Node>& node, NodePreHook hook) {
  TESSERA_CHECK(node != nullptr, "register_pre_hook: null node");
  const int64_t id = node->add_pre_hook(std::move(hook));
  std::weak_ptr<Node> weak = node;
  return HookHandle([weak, id] {
    if (auto locked = weak.lock()) locked->remove_pre_hook(id);
  });
}

void retain_grad(Tensor& tensor) {
  TESSERA_CHECK(tensor.defined() && tensor.requires_grad(), "retain_grad: the tensor does not require grad");
  if (tensor.is_leaf()) return;  // leaves keep their .grad anyway
  AutogradMeta& meta = tensor.autograd_meta();
  if (meta.retains_grad) return;
  meta.retains_grad = true;
  // Weak: the node owns the hook, and the tensor owns the node.
  std::weak_ptr<TensorImpl> weak = tensor.impl_ptr();
  tensor.grad_fn()->add_output_hook(tensor.output_nr(), [weak](const Tensor& grad) {
    if (auto impl = weak.lock()) {
      Tensor& stored = impl->autograd->grad;
      if (stored.defined()) {
        ops::add_(stored, grad);
      } else {
        stored = ops::clone(grad);
      }
    }
    return Tensor();
  });
}

}  // namespace tessera::autograd
