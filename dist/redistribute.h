// redistribute: a DTensor moved to other placements over the same mesh, as a
// differentiable function of its local tensor.
//
// Each mesh dim's change is one collective (or none) along that dim's group:
//   Shard(d)  -> Replicate   all-gather            Replicate -> Shard(d)  local slice
//   Partial   -> Replicate   all-reduce (sum)      Replicate -> Partial   coordinate 0 keeps it, others 0
//   Partial   -> Shard(d)    reduce-scatter        Shard(d)  -> Shard(e)  all-gather, then slice
// Where several mesh dims shard one tensor dim (the first splits it, the
// next splits each piece again), a dim whose outer neighbour changes is
// gathered first and sliced again after.
//
// The gradient runs the conjugate move: the output's gradient, laid out as
// `grad_placements` (default: the output's own placements), is moved to the
// input's placements with Partial read as Replicate, since each term of a
// pending sum has the whole sum's gradient. So the pairs of tensor and
// sequence parallelism come out of one function:
//   Shard(1)  -> Replicate, grad Partial    all-gather,     backward reduce-scatter
//   Partial   -> Shard(1)                   reduce-scatter, backward all-gather
//   Partial   -> Replicate                  all-reduce,     backward identity
//   Replicate -> Replicate, grad Partial    identity,       backward all-reduce
// A gradient placement may differ from the output's only as Replicate vs
// Partial where the output is Replicate (a replicated value that each rank
// uses differently has a partial gradient); where the output is Partial its
// gradient is Replicate.
#pragma once

#include <optional>

#include "dist/dtensor.h"

namespace tessera::dist {

struct RedistributeOptions {
  // How the gradient of the result is laid out; default: as the result.
  std::optional<Placements> grad_placements;
};

// Collective over every mesh dim whose placement changes (all ranks of the
// mesh call it with the same arguments). The result never aliases the input.
DTensor redistribute(const DTensor& source, Placements target, const RedistributeOptions& options = {});

// The data movement alone, on a local tensor laid out as `from` (no autograd):
// what redistribute and DTensor::full_tensor run.
Tensor redistribute_local(const Tensor& local, const DeviceMesh& mesh, const Shape& global_shape,
                          const Placements& from, const Placements& to);

}  // namespace tessera::dist
