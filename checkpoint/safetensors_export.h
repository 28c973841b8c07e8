// Full-model export to one .safetensors file, and import from one: the
// hand-off to and from the Python world (safetensors.numpy / safetensors.torch
// load it; any safetensors file with matching names and shapes loads here).
//
// export_safetensors streams: the ranks first agree on what to write (a
// mismatch of names, dtypes or global shapes is named on every rank), rank 0
// writes the header, then for each tensor in name order the owners of its
// pieces send them to rank 0 one at a time, and rank 0 assembles the tensor,
// appends its bytes and drops it. Rank 0 holds at most one gathered tensor
// plus one piece in flight, every other rank at most one piece. The file goes
// to PATH.tmp, is fsynced and renamed to PATH (over it, or never over a
// written file: ExportOptions::publish), like a checkpoint; an error on any
// rank is raised on every rank.
//
// import_safetensors lets every rank read only the byte span of each tensor
// that covers its piece (a row shard reads just its rows), so no rank reads
// the model.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"

namespace tessera::checkpoint {

struct ExportOptions {
  dist::ProcessGroupPtr group = nullptr;  // null: dist::world(), or this process alone
  std::map<std::string, std::string> metadata{};  // the file's "__metadata__" (string to string)
  bool sync = true;
  Publish publish = Publish::replace;  // no_clobber: an existing PATH is an error, and PATH.tmp is kept
};

// PATH.tmp: where an export to PATH is written before it is published.
std::string export_temporary_path(const std::string& path);

// Rank 0's end of a streamed export: begin() with every entry (name, dtype,
// global shape; offsets unset) once the ranks agree, write() with each
// tensor whole (on the CPU) in name order, commit() after the last;
// abandon() after any of them threw, to remove what was written.
class ExportSink {
 public:
  virtual ~ExportSink() = default;
  virtual void begin(const std::vector<SafetensorsEntry>& entries) = 0;
  virtual void write(const std::string& name, const Tensor& whole) = 0;
  virtual void commit() = 0;
  virtual void abandon() noexcept = 0;
};

// The streaming collective behind every export: the ranks agree on the
// entries, then each tensor is assembled on rank 0 from its owners' pieces
// and handed to `sink` (rank 0's; null elsewhere), one at a time. An error on
// any rank, the sink's included, is raised on every rank. Null group: as
// ExportOptions::group.
void export_through_rank0(const DistributedStateDict& state, const dist::ProcessGroupPtr& group, ExportSink* sink);

// Collective over the group: every rank passes the same names and global shapes.
void export_safetensors(const std::string& path, const DistributedStateDict& state, const ExportOptions& options = {});

struct ImportOptions {
  // Strict: a name of `state` missing from the file, or a tensor of the file
  // absent from `state`, is an error. Shapes must always match. A float
  // tensor loads into any float dtype (converted); an integer or bool one only
  // into its own dtype, and anything else is an error before any data is read.
  bool strict = true;
};

struct ImportReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  std::map<std::string, std::string> metadata;
};

// Fills `destination`, the box of the file's tensor `entry` that starts at
// `offsets` (any strides: a transposed view fills a column block), reading
// only the bytes that cover it; converts floats (loads_into must allow the
// dtypes). `header` is the file's at `path`.
void read_safetensors_box(const std::string& path, const SafetensorsHeader& header, const SafetensorsEntry& entry,
                          const Tensor& destination, const Shape& offsets);

// Fills the local pieces of `state` in place. Not collective: each rank reads on its own.
ImportReport import_safetensors(const std::string& path, const DistributedStateDict& state,
                                const ImportOptions& options = {});

}  // namespace tessera::checkpoint
