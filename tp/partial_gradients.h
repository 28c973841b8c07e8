// Partial gradients under sequence parallelism: a replicated parameter that
// meets sequence-sharded activations (a norm's weight, a row-wise bias) gets
// on each tp rank only its sequence slice's share of the gradient. The sum
// over the tp group runs as a gradient hook of the nn::Parameter, so it
// follows the parameter through to_empty and tensor swaps, and every rank
// ends the backward with the same, whole gradient.
#pragma once

#include "dist/device_mesh.h"
#include "nn/module.h"

namespace tessera::tp {

// Sums `parameter`'s gradients over the mesh's group from now on; the hook is
// kept on `module` (the module that owns the parameter).
void sum_partial_gradients(nn::Module& module, nn::Parameter& parameter, const dist::DeviceMesh& mesh);

// Removes every such sum in the tree: each rank then keeps its own partial
// gradient. No plan wants this; it is the test-only switch that proves the
// sums matter (a run without them trains norms on a fraction of the data).
void remove_partial_gradient_sums(nn::Module& root);

}  // namespace tessera::tp
