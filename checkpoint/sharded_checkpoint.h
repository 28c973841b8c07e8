// checkpoint::save / load: a sharded checkpoint of any state dict of names to
// tensors (whole on every rank), DTensors (sharded or replicated on a mesh)
// or boxed pieces (several boxes of the global tensor on one rank: a
// tensor-parallel piece, with FSDP's rows of it).
//
// save(dir): every rank writes only the pieces it owns (a DTensor's local
// piece when its coordinate on every Replicate mesh dim is 0: replicated data
// is written once; whole tensors by rank 0) into its own .safetensors file,
// in parallel; rank 0 gathers the chunk lists and writes metadata.json last.
// All of it goes to `dir.tmp`, is fsynced, and is renamed to `dir` in one
// step, so a crash leaves either no `dir` or a complete one.
//
// load(dir): every rank reads the metadata, validates names, shapes and dtypes
// (all problems in one error), then reads only the byte ranges of the chunks
// that overlap its own pieces, verifying their checksums: a checkpoint saved
// on N ranks, or on a 2-D mesh, loads on M ranks or a 1-D mesh.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/metadata.h"
#include "dist/dtensor.h"
#include "dist/process_group.h"

namespace tessera::checkpoint {

// A local tensor and where it starts in the global tensor.
struct LocalBox {
  Tensor local;
  Shape offsets;
};

// What one rank holds of a tensor as several boxes (views of its local
// tensor), and whether it writes them: tensor parallelism's layout, "tp first,
// dp inside", which a DTensor's placements cannot say (GPT's fused qkv gives
// a rank a box of each of q, k and v; FSDP then keeps rows of those).
// checkpoint::entry_like builds them from a Parameter's specs.
struct BoxedPiece {
  Shape global_shape;
  std::vector<LocalBox> boxes;
  bool written = true;  // false where another rank holds (and writes) the same data
};

using StateEntry = std::variant<Tensor, dist::DTensor, BoxedPiece>;
using DistributedStateDict = std::map<std::string, StateEntry>;

// An entry's local boxes: one for a whole tensor or a DTensor's piece.
std::vector<LocalBox> local_boxes_of(const StateEntry& entry);
const Shape& global_shape_of(const StateEntry& entry);
// Refuses an entry that is a DTensor with a Partial placement: its pieces
// are terms of a pending sum, not pieces of the value (save, load and export
// call it first, on every rank alike).
void check_no_pending_sums(const DistributedStateDict& state, const char* op);


struct SaveOptions {
  // The ranks that save together (every one calls save). Null: dist::world(),
  // or this process alone when there is none.
  dist::ProcessGroupPtr group = nullptr;
  nlohmann::json training_state = nlohmann::json::object();  // step, RNG, data position, config...
  std::optional<int64_t> step = std::nullopt;  // recorded in the metadata (CheckpointManager sets it and the run id)
  std::string run_id = "";
  bool sync = true;  // fsync files and directories (off only for tests of speed)
};

void save(const std::string& dir, const DistributedStateDict& state, const SaveOptions& options = {});

// save() on a rank that has already failed to prepare its part
// (`local_error` non-empty): it still takes part in every collective of the
// save, so all ranks raise that error instead of waiting for this one.
void save_or_report(const std::string& dir, const DistributedStateDict& state, const SaveOptions& options,
                    const std::string& local_error);

// Whether `rank` writes the entry's local piece: a DTensor's piece when its
// mesh coordinate is 0 on every Replicate dim (replicated data is written
// once), a whole tensor on rank 0 only, a boxed piece as it says.
bool writes_piece(const StateEntry& entry, int rank);

struct LoadOptions {
  dist::ProcessGroupPtr group = nullptr;
  // Strict: keys missing from the checkpoint or absent from `state` are errors.
  bool strict = true;
};

struct LoadReport {
  std::vector<std::string> missing_keys;     // in `state`, not in the checkpoint (left as they were)
  std::vector<std::string> unexpected_keys;  // in the checkpoint, not in `state`
  nlohmann::json training_state;
};

// DIR/metadata.json, parsed and validated (no tensor data is read): what a
// loader checks before building or loading anything (training state, shapes).
CheckpointMetadata read_metadata(const std::string& dir);

// Fills the local tensors of `state` in place: a float tensor into any float
// dtype (converted), an integer or bool one only into its own dtype. Names,
// shapes and dtypes are checked before anything is read; a corrupt chunk found
// while reading throws with the state partly loaded (load again, or discard it).
LoadReport load(const std::string& dir, const DistributedStateDict& state, const LoadOptions& options = {});

}  // namespace tessera::checkpoint
