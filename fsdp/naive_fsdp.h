// NaiveFSDP: fully sharded data parallelism in its plainest form, to read
// before fully_shard (fsdp/fully_shard.h), which computes the same thing
// faster. Every parameter is cut along dim 0 into one chunk per rank
// (ceil(rows / N) rows each, so the last ranks may be short or empty; each
// rank's buffer is padded to the same size, as collectives need). A rank
// keeps only its chunk, the shard, and the optimizer steps the shards:
//
//   NaiveFSDP fsdp(model, world);  // model built whole, the same on every rank
//   Optimizer optimizer(fsdp.shards());  // any optim:: optimizer
//   per step: optimizer.zero_grad();
//             fsdp.gather();                    // one all-gather per parameter
//             backward(loss_of(model(x)));      // this rank's micro-batch
//             fsdp.reduce_scatter_gradients();  // one reduce-scatter (mean) per parameter
//             optimizer.step();
//
// Between gather and reduce_scatter_gradients the model holds whole
// parameters; otherwise they are empty and the shards are all there is. No
// flat buffers, no prefetch, no overlap of communication with compute, no
// hooks: what fully_shard adds to this, and why, is in the README.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "nn/module.h"

namespace tessera::fsdp {

class NaiveFSDP {
 public:
  // Takes every parameter of `model` (tied ones once) and keeps this rank's shard.
  NaiveFSDP(nn::Module& model, dist::ProcessGroupPtr group);

  // Rebuilds each whole parameter from every rank's shard.
  void gather();
  // Averages each whole parameter's gradient over the ranks into this rank's
  // shard's gradient, then empties the whole parameters.
  void reduce_scatter_gradients();
  // The shards, named as the parameters they are cut from: what the optimizer steps.
  std::vector<nn::NamedParameter> shards() const;

 private:
  struct ShardedParameter {
    std::string name;
    std::shared_ptr<nn::Parameter> whole;  // the model's; empty between steps
    Shape shape;                           // the whole parameter's
    Tensor padded_shard;                   // [rows_per_rank, ...], zero past the rank's rows
    std::shared_ptr<nn::Parameter> shard;  // the rank's rows of padded_shard
  };

  dist::ProcessGroupPtr group_;
  std::vector<ShardedParameter> parameters_;
};

}  // namespace tessera::fsdp
