// The backward engine: from the root gradient, it counts each node's
// dependencies, runs nodes whose inputs are all in (latest-created first;
// AccumulateGrad nodes as soon as they are ready, so post-accumulate hooks
// fire early), routes each result along its edges, and at the end runs the
// callbacks queued during the pass. The graph is freed as it goes unless
// retain_graph. Hooks, formulas and callbacks run with grad mode off; an
// exception from any of them leaves the pass as it is (callbacks not run) and
// propagates unchanged.
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

// Returns d(outputs)/d(inputs) without touching any .grad: only nodes above
// an input run, leaves' hooks and post-accumulate hooks do not (they belong
// to accumulation), non-leaf tensor hooks and node pre-hooks do. An input
// that the outputs do not depend on gets an undefined tensor.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                BackwardOptions options = {});

// Queues `callback` to run once when the backward pass now running ends
// (after every node). Only valid while a backward pass is running on this thread.
void queue_callback(std::function<void()> callback);
// True while this thread is inside a backward pass.
bool in_backward();

}  // namespace tessera::autograd
