// optim::clip_grad_norm_: the global L2 norm of all gradients (accumulated in
// f64), and gradients scaled down to max_norm when it is exceeded.
#pragma once

#include <memory>
#include <vector>

#include "nn/parameter.h"

namespace tessera::optim {

// Returns the total norm sqrt(sum of squares of every gradient); parameters
// without a gradient are skipped. When max_norm / (norm + 1e-6) < 1 every
// gradient is multiplied by that factor (torch's rule). A non-finite norm is
// returned as is and nothing is scaled, so the caller can skip the step.
// Sharded parameters (FSDP's shards, tensor parallelism's Shard(d) pieces)
// add their sum of squares across their shard groups
// before the sqrt (a collective: every rank of those groups must call this
// with the same parameters), so the norm is the global one on every rank and
// every rank clips by the same factor.
double clip_grad_norm_(const std::vector<std::shared_ptr<nn::Parameter>>& params, double max_norm);
// The same clipping, with the norm left where the gradients live (a 0-d f64
// tensor; a cpu zero when no parameter has a gradient): on cuda nothing waits
// for the device, and a training loop reads the norm together with its loss.
Tensor clip_grad_norm_tensor(const std::vector<std::shared_ptr<nn::Parameter>>& params, double max_norm);

}  // namespace tessera::optim
