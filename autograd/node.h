// A node of the backward graph: one recorded op. It maps the gradients of its
// outputs to the gradients of its inputs (apply) and points, per input, to the
// node that produced that input (an Edge). Leaves end in AccumulateGrad nodes,
// which add into the leaf's .grad.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/tensor.h"

namespace tessera::autograd {

class Node;

// Where a gradient goes: input `input_nr` of `node`. An edge with no node
// means the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool is_valid() const { return node != nullptr; }
};

using TensorList = std::vector<Tensor>;

// Runs before a node's apply, on the gradients flowing into it; may replace them.
using NodePreHook = std::function<TensorList(const TensorList& grad_outputs)>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grad_outputs[i] is the gradient of output i (undefined when no gradient
  // reached it); returns one gradient per next edge (undefined = none).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors once backward has used them (unless retain_graph).
  virtual void release_saved_tensors() {}
  // Frees what the backward held (saved tensors and edges); the engine calls
  // it after running the node unless retain_graph. A released node cannot
  // run again: a second backward through it throws.
  void release();
  bool is_released() const { return released_; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  uint32_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(uint32_t outputs) { num_outputs_ = outputs; }
  // Increases with creation order; the engine runs later nodes first, so the
  // backward visits modules in reverse forward order (FSDP prefetch relies on it).
  uint64_t sequence_nr() const { return sequence_nr_; }

  int64_t add_pre_hook(NodePreHook hook);
  bool remove_pre_hook(int64_t handle);
  const std::vector<std::pair<int64_t, NodePreHook>>& pre_hooks() const { return pre_hooks_; }
  // Tensor grad hooks of non-leaf outputs of this node, per output index.
  int64_t add_output_hook(uint32_t output_nr, GradHook hook);
  bool remove_output_hook(int64_t handle);
  const std::vector<std::tuple<int64_t, uint32_t, GradHook>>& output_hooks() const { return output_hooks_; }

 private:
  std::vector<Edge> next_edges_;
  uint32_t num_outputs_ = 1;
  uint64_t sequence_nr_;
  bool released_ = false;
  std::vector<std::pair<int64_t, NodePreHook>> pre_hooks_;
  std::vector<std::tuple<int64_t, uint32_t, GradHook>> output_hooks_;
};

// The edge a gradient for `tensor` must follow: its grad_fn, or (for a leaf
// that requires grad) its AccumulateGrad node, or none.
Edge gradient_edge(const Tensor& tensor);
// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> tensors);
bool any_requires_grad(const TensorList& tensors);
// Makes `output` (output number `output_nr` of node) carry node as its grad_fn.
void set_history(Tensor& output, const std::shared_ptr<Node>& node, uint32_t output_nr = 0);

// The sink of a leaf: adds incoming gradients into the leaf's .grad (stealing
// the buffer when .grad is empty), running the leaf's grad hooks before and
// its post-accumulate-grad hooks after.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf);
  TensorList apply(TensorList&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  Tensor leaf() const;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

}  // namespace tessera::autograd
