// What every differentiable function does after computing its result:
// connect a new backward node to the op's inputs (one edge each) and make it
// the output's grad_fn. Shared by autograd/functions/*.cpp only.
//
// Before computing, each one opens `const GradInputsAllowed recorded_here;`
// (tensor/raw_op_guard.h): the raw ops it calls may then read inputs that
// require grad, because the function records their gradient itself. Backward
// formulas need no such scope: the engine runs them with grad mode off.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "tensor/ops.h"

namespace tessera::autograd {

// One edge per input, in order; an input that needs no gradient gets an
// invalid edge, so input i of the op is always edge i of the node.
inline std::vector<Edge> collect_edges(std::initializer_list<const Tensor*> inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor* input : inputs) edges.push_back(gradient_edge(*input));
  return edges;
}

inline std::vector<Edge> collect_edges(const TensorList& inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& input : inputs) edges.push_back(gradient_edge(input));
  return edges;
}

// Makes `node` the grad_fn of `output`, with edges to `inputs`.
inline void record(Tensor& output, const std::shared_ptr<Node>& node, std::initializer_list<const Tensor*> inputs) {
  node->set_next_edges(collect_edges(inputs));
  set_history(output, node, 0);
}

// Inside a node's apply: whether input `i` of its op wants a gradient.
inline bool needs_grad(const Node& node, size_t i) { return node.next_edges()[i].is_valid(); }

// The gradient of an input that was broadcast: summed over the broadcast dims,
// in the input's dtype.
inline Tensor reduce_to(const Tensor& grad, const Shape& shape, DType dtype) {
  return ops::to(ops::sum_to_shape(grad, shape), dtype);
}

}  // namespace tessera::autograd
