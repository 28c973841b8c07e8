// Full-model export to one .safetensors file, and import from one: the
// hand-off to and from the Python world (safetensors.numpy / safetensors.torch
// load it; any safetensors file with matching names and shapes loads here).
//
// export_safetensors streams: rank 0 writes the header (every name, dtype and
// global shape is known on every rank), then for each tensor in name order the
// ranks gather that one tensor to rank 0, which appends its bytes and drops
// it; rank 0 never holds more than one gathered tensor at a time. The file
// goes to PATH.tmp, is fsynced and renamed, like a checkpoint.
//
// import_safetensors lets every rank read only the rows of each tensor that
// its piece holds (byte ranges of the one file), so no rank reads the model.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"

namespace tessera::checkpoint {

struct ExportOptions {
  dist::ProcessGroupPtr group = nullptr;  // null: dist::world(), or this process alone
  std::map<std::string, std::string> metadata;  // the file's "__metadata__" (string to string)
  bool sync = true;
};

// Collective over the group: every rank passes the same names and global shapes.
void export_safetensors(const std::string& path, const DistributedStateDict& state, const ExportOptions& options = {});

struct ImportOptions {
  // Strict: a name of `state` missing from the file, or a tensor of the file
  // absent from `state`, is an error. Shapes must always match; dtypes are converted.
  bool strict = true;
};

struct ImportReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  std::map<std::string, std::string> metadata;
};

// Fills the local pieces of `state` in place. Not collective: each rank reads on its own.
ImportReport import_safetensors(const std::string& path, const DistributedStateDict& state,
                                const ImportOptions& options = {});

}  // namespace tessera::checkpoint
