// A model stored the way Hugging Face stores one: a directory holding either
// one model.safetensors, or shards model-0000K-of-0000N.safetensors with a
// model.safetensors.index.json whose "weight_map" names the shard of every
// tensor. Reading opens only the headers; each tensor's bytes are read where
// a caller asks for them (read_safetensors_box), so no process needs the
// model whole. Writing plans the shards by size, in the order tensors come.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace tessera::checkpoint {

inline constexpr const char* kSingleSafetensorsFile = "model.safetensors";
inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

// One stored tensor: the file that holds it, that file's header and its
// entry (pointers into the SafetensorsIndex: valid while it lives).
struct StoredTensor {
  std::string path;
  const SafetensorsHeader* header = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

class SafetensorsIndex {
 public:
  // Reads DIR/model.safetensors.index.json when present, else
  // DIR/model.safetensors. Throws tessera::Error naming the directory and
  // file when neither exists, the index is not JSON of that form, a shard it
  // names is missing or escapes DIR, or a shard lacks a tensor the index puts there.
  static SafetensorsIndex open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
  // Throws naming the directory when `name` is not stored.
  StoredTensor at(const std::string& name) const;
  // The __metadata__ of the files (the first file's, for shards).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string dir_;
  std::map<std::string, SafetensorsHeader> headers_;  // by file name
  std::map<std::string, std::string> tensors_;        // tensor name -> file name
  std::map<std::string, std::string> metadata_;
};

// Shards for `entries` in their order: a new shard starts when the next
// tensor would take the current one past `max_shard_bytes` (a tensor larger
// than that gets a shard of its own). One shard is named model.safetensors;
// N shards model-00001-of-0000N.safetensors, ... Entries keep their dtype
// and shape; offsets are laid out per shard.
struct SafetensorsShard {
  std::string file;
  std::vector<SafetensorsEntry> entries;
};
std::vector<SafetensorsShard> plan_safetensors_shards(const std::vector<SafetensorsEntry>& entries,
                                                      int64_t max_shard_bytes);

// The index JSON of shards (only needed with more than one):
// {"metadata": {"total_size": bytes of all tensors}, "weight_map": {name: file}}.
std::string safetensors_index_json(const std::vector<SafetensorsShard>& shards);

}  // namespace tessera::checkpoint
