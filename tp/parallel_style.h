// Tensor-parallel styles: what parallelize_module (tp/parallelize.h) does to
// one module. A style lays the module's parameters out over a 1-D tp mesh
// (nn::TensorParallelSpec on each Parameter) and installs forward hooks that
// move its activations between layouts.
//
// Activations between modules are plain local tensors; their layout over the
// tp mesh is what the plan says it is:
//   Replicate()  every tp rank holds the whole activation;
//   Shard(d)     each holds a slice of dim d (sequence parallelism: d = 1,
//                [B, T/tp, C]; a column-wise output: the last dim);
//   Partial()    each holds a term of a pending sum (a row-wise product).
// Each move is dist::redistribute on the local tensor, so its backward is the
// conjugate collective (docs/distributed.md has the table). The Megatron
// pairs come out as:
//   column-wise input, Replicate    identity forward, all-reduce of the gradient
//   column-wise input, Shard(1)     all-gather forward, reduce-scatter backward
//   row-wise output, Replicate      all-reduce forward, identity backward
//   row-wise output, Shard(1)       reduce-scatter forward, all-gather backward
// A Shard(d) activation is split evenly: dim d must divide by the tp size,
// and a style refuses one that does not, naming both numbers.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/dtensor.h"
#include "nn/module.h"

namespace tessera::tp {

using Layout = dist::Placement;

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Applied to the module named `name` (for error messages) over the 1-D tp
  // mesh; every rank of the mesh applies the same styles in the same order.
  virtual void apply(nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const = 0;
  // Throws what apply would throw for this module and mesh, changing
  // nothing: parallelize_module checks every match before it applies any.
  // The default checks the mesh (1-D); styles bound to a layer add theirs.
  virtual void check(const nn::Module& module, const std::string& name, const dist::DeviceMesh& mesh) const;
  // "ColwiseParallel(input Shard(1), output Shard(-1), 3 sections)"
  virtual std::string describe() const = 0;
};
using ParallelStylePtr = std::shared_ptr<const ParallelStyle>;

// nn::Linear or nn::TiedLinear y = x W^T + b split by output features: W and
// b Shard(0), each rank computing its slice of the outputs.
struct ColwiseOptions {
  // The input's layout, moved to Replicate before the product (its gradient
  // summed over tp in the backward). nullopt: the input is replicated
  // already by a parent's PrepareModuleInput, which sums the gradient once
  // for all the children that share the input (attention's wq, wk and wv).
  std::optional<Layout> input_layout = dist::Replicate{};
  // Shard(-1): each rank keeps its columns (the next module is row-wise, or
  // the loss runs on vocabulary shards); Replicate: all-gathered.
  Layout output_layout = dist::Shard{-1};
  // A fused projection's equal parts along the outputs (GPT's qkv: 3), each
  // split over the ranks, so that a rank holds its heads' rows of each.
  int64_t sections = 1;
  // Async tensor parallelism: 0 moves the input whole before the product;
  // k >= 1 fuses its all-gather into the product in k batch chunks, each
  // chunk's all-gather overlapping another's GEMM (tp/collective_matmul.h).
  // Needs a sequence-sharded input (Shard(1)) and a Linear.
  int64_t async_chunks = 0;
};
ParallelStylePtr colwise_parallel(ColwiseOptions options = {});

// nn::Linear split by input features: W Shard(1), the input Shard(-1) (a
// column-wise module's output). Each rank's product is a term of the sum;
// the output hook sums it (Replicate: all-reduce; Shard(1): reduce-scatter)
// and then adds the bias (Replicate; with a Shard(1) output its gradient is
// partial and summed over tp).
struct RowwiseOptions {
  Layout output_layout = dist::Replicate{};
  // Async tensor parallelism: 0 sums the product whole; k >= 1 fuses the
  // reduce-scatter onto the sequence into the product in k batch chunks
  // (tp/collective_matmul.h). Needs a Shard(1) output.
  int64_t async_chunks = 0;
};
ParallelStylePtr rowwise_parallel(RowwiseOptions options = {});

// nn::Embedding split by rows (the vocabulary): each rank looks up the
// indices its rows hold (zero rows for the others, nn::Embedding's masked
// lookup) and the output hook sums the terms. The indices are replicated.
struct VocabParallelOptions {
  Layout output_layout = dist::Replicate{};
};
ParallelStylePtr vocab_parallel_embedding(VocabParallelOptions options = {});

// Sequence parallelism for modules that work row by row (LayerNorm, RMSNorm,
// Dropout): their input and output stay Shard(1) with no communication;
// their parameters, replicated, get partial gradients that are summed over
// tp; a Dropout draws its slice of the whole activation's mask.
ParallelStylePtr sequence_parallel();

// Moves the module's inputs from `input_layouts` to `desired_input_layouts`
// before its forward (one entry per input; nullopt leaves that input alone).
// An input made Replicate feeds tensor-parallel children: its gradient is
// partial, and the move's backward sums it (all-reduce, or reduce-scatter
// back to Shard(1)).
struct PrepareInputOptions {
  std::vector<std::optional<Layout>> input_layouts;
  std::vector<std::optional<Layout>> desired_input_layouts;
};
ParallelStylePtr prepare_module_input(PrepareInputOptions options);

// Async tensor parallelism for a module whose children Linears (column-wise,
// laid out by their own entries with input_layout nullopt) all multiply its
// sequence-sharded input: Llama's attention (wq, wk, wv) and feed-forward (w1,
// w3). One all-gather serves them all, fused into their products in
// async_chunks batch chunks (all_gather_linears: chunk j's GEMMs wait for
// chunk j only); the input's gradient, summed over the children, is
// reduce-scattered chunk by chunk. Instead of a PrepareModuleInput.
struct GatherIntoOptions {
  std::vector<std::string> children;
  int64_t async_chunks = 1;
};
ParallelStylePtr gather_sequence_into(GatherIntoOptions options);

// Moves the module's output from `output_layout` to `desired_output_layout`
// after its forward (GPT's position embedding: Replicate -> Shard(0), each
// rank keeping its positions' rows; the backward all-gathers the gradient).
struct PrepareOutputOptions {
  Layout output_layout;
  Layout desired_output_layout;
};
ParallelStylePtr prepare_module_output(PrepareOutputOptions options);

// The moves the styles run, for plans and tests: `local` laid out as `from`
// over the 1-D mesh becomes `to`, differentiably. `global_size` is the
// logical size of the dim a Shard(d) of `from` splits (-1: the local size
// times the tp size, an even split, checked); grad_layout as in
// dist::redistribute.
Tensor move_activation(const Tensor& local, const dist::DeviceMesh& mesh, const Layout& from, const Layout& to,
                       std::optional<Layout> grad_layout = std::nullopt, int64_t global_size = -1);

}  // namespace tessera::tp
