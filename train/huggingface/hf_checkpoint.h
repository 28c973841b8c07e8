// Hugging Face model directories in and out: config.json with
// model.safetensors, or shards with model.safetensors.index.json
// (checkpoint/safetensors_index.h), as `save_pretrained` writes them and
// `from_pretrained` reads them. The names, layouts and config keys are
// hf_tensor_map.h's and hf_config.h's.
//
// Loading is per rank: each rank reads, of each stored tensor, only the
// byte range covering its own piece (an FSDP row shard reads its rows; a
// GPT-2 Conv1D weight, stored transposed, is read column-wise through a
// strided view), so a model never exists whole in one rank's memory.
// Exporting streams through rank 0 one tensor at a time
// (checkpoint::export_through_rank0).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/file_io.h"
#include "checkpoint/sharded_checkpoint.h"
#include "train/huggingface/hf_companion_files.h"
#include "train/huggingface/hf_config.h"

namespace tessera::train {

inline constexpr const char* kHfConfigFile = "config.json";

// Whether `path` is a directory holding a config.json (then --init-from reads it as a Hugging Face model).
bool is_hf_model_dir(const std::string& path);

// Whether the model directory holds a tokenizer train::Tokenizer::load reads
// from a directory: tokenizer.json, or GPT-2's vocab.json with merges.txt.
bool holds_tokenizer(const std::string& dir);

// DIR/config.json, mapped; throws tessera::Error naming the file and key.
HfModelInfo read_hf_model_info(const std::string& dir);

// Fills this rank's pieces of `state` (model_state(model, ""), the model
// built from `info.config`) from DIR's tensors. Every problem is found
// before any data is read and reported in one tessera::Error naming DIR:
// a parameter missing from the files, a shape or dtype that differs, and a
// stored tensor tessera has no parameter for (the buffers
// is_ignored_hf_tensor names aside). Not collective.
void load_hf_weights(const std::string& dir, const HfModelInfo& info,
                     const tessera::checkpoint::DistributedStateDict& state);

struct HfExportOptions {
  tessera::dist::ProcessGroupPtr group = nullptr;  // null: dist::world(), or this process alone
  int64_t max_shard_bytes = int64_t{5} << 30;      // transformers' default shard size
  bool sync = true;                                // fsync the files and the directory
  // no_clobber: an existing DIR is an error (and the complete DIR.tmp is kept).
  tessera::checkpoint::Publish publish = tessera::checkpoint::Publish::replace;
  // What the model came from: the export carries its token ids, generation
  // config and tokenizer files (hf_companion_files.h). Empty: a byte-level
  // model of its own, with null ids and no tokenizer.
  HfExportSources sources = {};
};

// Collective: writes the model (`state` as for load_hf_weights) to DIR as
// config.json and model.safetensors (or shards and their index) in the
// checkpoint's layout, in the parameters' dtype, with what options.sources
// gives (generation_config.json, the tokenizer's files byte for byte, the
// token ids in config.json), read on rank 0 only. Everything is written to
// DIR.tmp first (emptied when it exists: an interrupted export's, or the
// directory a claim holds, output_claim.h), then DIR.tmp is renamed to DIR;
// an existing DIR is replaced only after the new one is complete. An error
// on any rank is raised on every rank.
void export_hf(const std::string& dir, const ModelConfig& config,
               const tessera::checkpoint::DistributedStateDict& state, const HfExportOptions& options = {});

}  // namespace tessera::train
