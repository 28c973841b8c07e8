// parallelize_module: tensor parallelism applied to a model by a plan, as
// PyTorch's parallelize_module does. A plan names modules by fully qualified
// name patterns and gives each a style (tp/parallel_style.h); tp/plans.h has
// the plans for nn::GPT and nn::Llama.
//
// Order with FSDP (as torchtitan): build on meta, parallelize on the tp mesh,
// then fully_shard on the data-parallel mesh, then to_empty and
// reset_parameters: every rank initialises exactly its piece, with the bits
// the 1-rank model has there (nn::init reads the pieces' specs).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tp/parallel_style.h"

namespace tessera::tp {

// Module name patterns with their styles, applied in order. A pattern is a
// fully qualified module name whose parts may be "*" (any one name):
// "blocks.*.attn.qkv" names every block's qkv.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStylePtr>>;

// Applies `plan` to `root` over the 1-D tp mesh; every rank of the mesh calls
// it with the same plan. Parameters no style lays out are replicated over tp
// (a Replicate spec without partial gradients: their gradients must come out
// whole on every tp rank, as a replicated activation's use gives them). A pattern that matches no module is refused (a
// misspelt plan would silently leave a layer replicated), as are a model that
// fully_shard already sharded and a second plan on the same root (its hooks
// would stack on the first's).
void parallelize_module(nn::Module& root, const dist::DeviceMesh& tp_mesh, const ParallelizePlan& plan);

// Whether `name` matches `pattern` (both dot-separated, "*" matching one part).
bool matches_module_pattern(const std::string& pattern, const std::string& name);

// The whole tensor of a parameter: its tensor-parallel pieces gathered
// (collective over its tp mesh), or a copy of a whole one.
Tensor full_tensor(const nn::Parameter& parameter);
// The whole tensor of `local` laid out as `spec` says on this rank: a
// parameter's piece, or the gradient of one (collective over the tp mesh).
Tensor full_tensor(const Tensor& local, const nn::TensorParallelSpec& spec);

// Every parameter (under each of its names, as nn::Module::state_dict) and
// persistent buffer, whole: what a 1-rank model's state_dict holds
// (collective over the tp mesh; every rank gets the dict).
nn::StateDict full_state_dict(nn::Module& root);

}  // namespace tessera::tp
