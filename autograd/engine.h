// The backward engine: from the root gradient, it counts each node's
// dependencies, runs nodes whose inputs are all in (latest-created first),
// routes each result along its edges, and at the end runs the callbacks
// queued during the pass. The graph is freed as it goes unless retain_graph.
#pragma once

#include <functional>

#include "autograd/node.h"

namespace tessera::autograd {

struct BackwardOptions {
  bool retain_graph = false;
};

// Backpropagates from `roots` with the given gradients (undefined gradient =
// ones, allowed only for one-element roots).
void backward(const TensorList& roots, const TensorList& grad_roots = {}, BackwardOptions options = {});
void backward(const Tensor& root, const Tensor& grad_root = {}, BackwardOptions options = {});

// Returns d(outputs)/d(inputs) without touching any .grad.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                BackwardOptions options = {});

// Queues `callback` to run once when the backward pass now running ends
// (after every node). Only valid while a backward pass is running on this thread.
void queue_callback(std::function<void()> callback);
// True while this thread is inside a backward pass.
bool in_backward();

}  // namespace tessera::autograd
