// Partial gradients under sequence parallelism: a replicated parameter that
// meets sequence-sharded activations (a norm's weight, a row-wise bias) gets
// on each tp rank only its sequence slice's share of the gradient; the
// nn::Parameter sums it over the tp group (nn::TensorParallelSpec's
// partial_gradient, nn::Parameter::set_sums_partial_gradient).
#pragma once

#include "nn/module.h"

namespace tessera::tp {

// Stops every such sum in the tree: each rank then keeps its own partial
// gradient. No plan wants this; it is the test-only switch that proves the
// sums matter (a run without them trains norms on a fraction of the data).
void remove_partial_gradient_sums(nn::Module& root);

}  // namespace tessera::tp
