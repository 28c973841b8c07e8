// State dicts of an FSDP model, as in FSDP2: the sharded one (each rank's
// shards as DTensors, no communication: what a sharded checkpoint saves), the
// full one (every tensor gathered whole on every rank) and loading a full one
// back, each rank copying only its own rows.
//
// Names are nn::Module::state_dict's: every parameter slot (a tied parameter
// under each of its names) and every buffer, by fully qualified name.
// `root` is the module fully_shard was applied to last.
#pragma once

#include <map>
#include <string>

#include "dist/dtensor.h"
#include "nn/module.h"

namespace tessera::fsdp {

// FSDP-managed parameters: their Shard(0) DTensor (FSDPParam::sharded_dtensor;
// (Replicate, Shard(0)) under HSDP), whether or not the group is unsharded now.
// Parameters FSDP does not manage and buffers: the whole tensor as a DTensor
// with every mesh dim Replicate, on the root's mesh. Local tensors share
// storage with the model and carry no autograd history. A model split by
// tensor parallelism is refused (its layout, tp first and dp inside, is not
// in the checkpoint format yet).
std::map<std::string, dist::DTensor> sharded_state_dict(nn::Module& root);

// Every tensor whole, on every rank (collective over the mesh: every rank
// calls it; each shared parameter is gathered once). Tensor-parallel pieces
// are gathered over FSDP's mesh, then over their tp group (collective there
// too).
nn::StateDict full_state_dict(nn::Module& root);

// Copies a full state dict (every rank passes the same one) into the model:
// each rank its own rows of each sharded parameter, whole tensors elsewhere,
// converting dtypes; no communication. Call it while the model is sharded
// (between steps). Missing keys, unexpected keys, shape mismatches and
// undefined tensors are all named in one error, and nothing is copied then.
// A tensor-parallel model is refused (not built yet).
void load_full_state_dict(nn::Module& root, const nn::StateDict& state);

}  // namespace tessera::fsdp
