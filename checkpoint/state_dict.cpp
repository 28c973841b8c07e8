// Model and optimizer state as named entries that view the live tensors.
#include "checkpoint/state_dict.h"

#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace {

// A tensor-parallel piece (with FSDP's rows of it) as the boxes of the
// logical tensor it holds: "tp first, dp inside".
BoxedPiece boxed_piece(const nn::Parameter& parameter, const Tensor& local) {
  const nn::TensorParallelSpec& tensor_parallel = *parameter.tensor_parallel();
  const auto& sharding = parameter.sharding();
  const int64_t tp_rank = tensor_parallel.mesh.coordinate(0);
  const int64_t dim = tensor_parallel.shard_dim();
  BoxedPiece piece;
  piece.global_shape = tensor_parallel.global_shape;
  // One copy of replicated data is written: tp rank 0's, and under HSDP the
  // first replica's.
  piece.written = dim >= 0 || tp_rank == 0;
  if (sharding) {
    for (size_t mesh_dim = 0; mesh_dim < sharding->placements.size(); ++mesh_dim) {
      if (std::holds_alternative<dist::Replicate>(sharding->placements[mesh_dim])) {
        piece.written = piece.written && sharding->mesh.coordinate(static_cast<int64_t>(mesh_dim)) == 0;
      }
    }
  }
  const int64_t first_row = sharding ? sharding->row_offset : 0;
  const Shape zeros(static_cast<size_t>(local.dim()), 0);
  for (const nn::TensorParallelSpec::RowRun& run : tensor_parallel.logical_rows(first_row, local.size(0), tp_rank)) {
    const Tensor rows = ops::narrow(local, 0, run.piece_row, run.count);
    if (dim <= 0) {
      Shape offsets = zeros;
      offsets[0] = run.logical_row;
      piece.boxes.push_back({rows, offsets});
      continue;
    }
    // Sharded on a later dim: the rows are whole rows of the logical tensor,
    // cut along `dim` into the piece's boxes.
    int64_t piece_offset = 0;
    for (const dist::ShardExtent& box : tensor_parallel.boxes(tp_rank)) {
      Shape offsets = zeros;
      offsets[0] = run.logical_row;
      offsets[static_cast<size_t>(dim)] = box.offset;
      piece.boxes.push_back({ops::narrow(rows, dim, piece_offset, box.length), offsets});
      piece_offset += box.length;
    }
  }
  if (piece.boxes.empty()) piece.boxes.push_back({ops::narrow(local, 0, 0, 0), zeros});  // an empty FSDP shard
  return piece;
}

}  // namespace

StateEntry entry_like(const nn::Parameter& parameter, const Tensor& local) {
  if (parameter.tensor_parallel()) return boxed_piece(parameter, local);
  if (!parameter.is_sharded()) return local;
  const nn::ShardingSpec& spec = *parameter.sharding();
  return dist::DTensor(local, spec.mesh, spec.placements, spec.global_shape);
}

DistributedStateDict model_state(const nn::Module& module, const std::string& prefix) {
  DistributedStateDict state;
  for (const auto& [name, parameter] : module.named_parameters()) {
    state[prefix + name] = entry_like(*parameter, parameter->tensor().detach());
  }
  return state;
}

DistributedStateDict optimizer_state(optim::Optimizer& optimizer) {
  optimizer.init_state();
  DistributedStateDict state;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const auto& [name, parameter] : group.params) {
      for (const auto& [key, value] : optimizer.state(name)) {
        // 0-d entries (the step count) are the same on every rank: whole tensors.
        state[kOptimizerPrefix + name + "." + key] = value.dim() == 0 ? StateEntry(value) : entry_like(*parameter, value);
      }
    }
  }
  return state;
}

DistributedStateDict training_state_dict(const nn::Module& module, optim::Optimizer& optimizer) {
  DistributedStateDict state = model_state(module);
  state.merge(optimizer_state(optimizer));
  return state;
}

}  // namespace tessera::checkpoint
