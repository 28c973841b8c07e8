// fsdp::sharding_plan: what fully_shard did to a model, printed, so memory
// and communication are visible before a step runs: per FSDP module its
// settings and, per parameter, the global shape and this rank's rows; then
// the per-rank totals (shards, gradients, the optimizer's state as the caller
// sizes it, unsharded buffers)
// and the bytes one training step moves. expected_comm_per_step gives those
// bytes as numbers: they are the volumes ProcessGroup::stats() counts
// (dist::collective_volume), so a test can hold the two equal.
#pragma once

#include <cstdint>
#include <string>

#include "nn/module.h"

namespace tessera::fsdp {

// The collectives FSDP issues on one rank for one training step, summed over
// every group of the root's tree:
//   all-gather      one per group in forward, and one more in backward for
//                   groups that reshard after forward (over the group of N
//                   ranks when reshard_after_forward = N);
//   reduce-scatter  one per group with trainable parameters: its gradient
//                   slot plus one presence flag per parameter, in reduce_dtype;
//   all-reduce      HSDP only: that reduced slot again over the replicate group.
struct StepCommVolume {
  int64_t all_gather_calls = 0;
  int64_t all_gather_bytes_sent = 0;
  int64_t all_gather_bytes_received = 0;
  int64_t reduce_scatter_calls = 0;
  int64_t reduce_scatter_bytes_sent = 0;
  int64_t reduce_scatter_bytes_received = 0;
  int64_t all_reduce_calls = 0;
  int64_t all_reduce_bytes_sent = 0;
  int64_t all_reduce_bytes_received = 0;

  int64_t total_sent() const { return all_gather_bytes_sent + reduce_scatter_bytes_sent + all_reduce_bytes_sent; }
  int64_t total_received() const {
    return all_gather_bytes_received + reduce_scatter_bytes_received + all_reduce_bytes_received;
  }
};

// One step of `micro_batches` forward + backward passes whose gradients are
// synced once, after the last (set_requires_gradient_sync(false) before the
// others, FSDP2's accumulation recipe); 1 = a plain step. `root` must be the
// module fully_shard was applied to last; its parameters must be materialised
// (to_empty), since this runs the root's lazy init when no forward has yet.
StepCommVolume expected_comm_per_step(nn::Module& root, int64_t micro_batches = 1);

// What the caller's optimizer keeps per parameter, for the per-rank totals:
// `copies` more tensors the size of each shard (2 for Adam's m and v),
// printed as `description`. The fsdp layer knows no optimizer; the default
// prints no such line.
struct OptimizerStateSize {
  std::string description;
  int copies = 0;
};

// The printable plan of `root` as seen from the calling rank (local shapes
// and padding differ per rank). Same preconditions as above; no communication.
std::string sharding_plan(nn::Module& root, const OptimizerStateSize& optimizer_state = {});

}  // namespace tessera::fsdp
