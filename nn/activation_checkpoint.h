// Activation checkpointing: a module whose forward keeps none of its
// activations and recomputes them when backward reaches it.
//
// Forward runs the module with recording off, so the only tensors it keeps
// for backward are its inputs, and records one node (CheckpointBackward)
// whose edges lead to the inputs and to the module's trainable parameters.
// When backward reaches that node it replays the forward with recording on,
// from the saved inputs and the random generator's saved position (so
// dropout draws the same masks), and takes the gradients of the replayed
// graph with autograd::grad. The parameters' gradients go out along the
// node's edges, so they accumulate, and their hooks (FSDP's reduce-scatter,
// tensor parallelism's partial sums) run, in the one backward pass, exactly
// as without checkpointing; gradients are the same bits.
//
// Under FSDP the recompute runs inside the module's backward, after FSDP's
// pre-backward all-gather: the replay calls forward_inputs, not operator(),
// so the module's own hooks (FSDP's, tensor parallelism's input and output
// layouts) do not run again and no all-gather is added. Its children's hooks
// do run: tensor parallelism's collectives inside a block are repeated.
//
// Selective checkpointing (Checkpointing::selective) also keeps the outputs
// of the forward's GEMMs and attention in a memo, and the replay takes them
// from it instead of computing them (autograd/recompute_memo.h): it holds
// about half of what the block holds without checkpointing, and recomputes
// only the cheap ops between those.
//
// The module must outlive the backward pass (an error otherwise), and its
// parameters must be the same tensors at backward as at forward.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "nn/module.h"
#include "nn/module_list.h"

namespace tessera::nn {

// Runs module.forward_inputs(inputs) as described above; Module::operator()
// calls it for a module with set_activation_checkpointing(true).
Tensor checkpointed_forward(Module& module, const TensorList& inputs);

// Which blocks a model checkpoints (train --ac):
//   off        none;
//   full       every block;
//   every:K    every K-th block, counted from 1 (blocks K-1, 2K-1, ... from 0),
//              as torchtitan's layer-wise policy counts them;
//   selective  every block, keeping its GEMMs' and attention's outputs
//              (autograd/recompute_memo.h): the norms, activations, dropout
//              and one GEMM of a fused GELU MLP are recomputed.
struct ActivationCheckpointPolicy {
  enum class Mode { off, full, every, selective };
  Mode mode = Mode::off;
  int64_t every = 1;  // K, for Mode::every

  // "off", "full", "every:K" with K >= 1 or "selective"; anything else is an
  // error naming it.
  static ActivationCheckpointPolicy parse(std::string_view text);
  std::string str() const;
  bool checkpoints(int64_t block_index) const;
  Checkpointing mode_of(int64_t block_index) const;
  bool operator==(const ActivationCheckpointPolicy&) const = default;
};

// Sets each block's checkpointing as the policy says (off for the blocks it
// does not pick); returns how many it turned on.
int64_t apply_activation_checkpointing(const ModuleList& blocks, const ActivationCheckpointPolicy& policy);

}  // namespace tessera::nn
