// Hugging Face's one-file or sharded safetensors layout: reading the index, planning shards.
#include "checkpoint/safetensors_index.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "tensor/error.h"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

// A shard name from the index must be a plain file name inside the directory.
void check_shard_name(const std::string& file, const std::string& index_path) {
  const fs::path name(file);
  TESSERA_CHECK(!file.empty() && name == name.filename() && file != "." && file != "..",
                "{}: weight_map names the file '{}'; a shard must be a file name in the same directory", index_path,
                file);
}

int64_t entry_bytes(const SafetensorsEntry& entry) {
  return shape_numel(entry.shape) * static_cast<int64_t>(element_size(entry.dtype));
}

}  // namespace

SafetensorsIndex SafetensorsIndex::open(const std::string& dir) {
  SafetensorsIndex index;
  index.dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / kSafetensorsIndexFile;
  std::error_code error;
  if (fs::exists(index_path, error)) {
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(read_file_text(index_path.string()));
    } catch (const nlohmann::json::parse_error& parse_error) {
      fail("{}: not valid JSON: {}", index_path.string(), parse_error.what());
    }
    TESSERA_CHECK(json.is_object() && json.contains("weight_map") && json["weight_map"].is_object(),
                  "{}: expected an object with a \"weight_map\" object (tensor name -> shard file)",
                  index_path.string());
    for (const auto& [name, file] : json["weight_map"].items()) {
      TESSERA_CHECK(file.is_string(), "{}: weight_map[\"{}\"] must be a file name, got {}", index_path.string(), name,
                    file.dump());
      check_shard_name(file.get<std::string>(), index_path.string());
      index.tensors_[name] = file.get<std::string>();
    }
    TESSERA_CHECK(!index.tensors_.empty(), "{}: weight_map is empty", index_path.string());
  } else {
    const fs::path single = root / kSingleSafetensorsFile;
    TESSERA_CHECK(fs::exists(single, error), "{}: holds neither {} nor {}", dir, kSingleSafetensorsFile,
                  kSafetensorsIndexFile);
    const SafetensorsHeader header = read_safetensors_header(single.string());
    for (const SafetensorsEntry& entry : header.entries) index.tensors_[entry.name] = kSingleSafetensorsFile;
  }

  for (const auto& [name, file] : index.tensors_) {
    if (index.headers_.count(file) == 0) {
      const fs::path path = root / file;
      TESSERA_CHECK(fs::exists(path, error), "{}: the shard {} that holds '{}' is missing", dir, file, name);
      index.headers_.emplace(file, read_safetensors_header(path.string()));
      if (index.metadata_.empty()) index.metadata_ = index.headers_.at(file).metadata;
    }
    const SafetensorsHeader& header = index.headers_.at(file);
    const bool present = std::any_of(header.entries.begin(), header.entries.end(),
                                     [&](const auto& entry) { return entry.name == name; });
    TESSERA_CHECK(present, "{}: {} does not hold '{}', which {} puts there", dir, file, name, kSafetensorsIndexFile);
  }
  return index;
}

std::vector<std::string> SafetensorsIndex::names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : tensors_) names.push_back(name);
  return names;
}

StoredTensor SafetensorsIndex::at(const std::string& name) const {
  const auto found = tensors_.find(name);
  TESSERA_CHECK(found != tensors_.end(), "{}: holds no tensor '{}'", dir_, name);
  const SafetensorsHeader& header = headers_.at(found->second);
  return {(fs::path(dir_) / found->second).string(), &header, &header.entry(name, dir_ + "/" + found->second)};
}

std::vector<SafetensorsShard> plan_safetensors_shards(const std::vector<SafetensorsEntry>& entries,
                                                      int64_t max_shard_bytes) {
  TESSERA_CHECK(max_shard_bytes > 0, "plan_safetensors_shards: max_shard_bytes must be positive, got {}",
                max_shard_bytes);
  std::vector<SafetensorsShard> shards;
  int64_t shard_bytes = 0;
  for (const SafetensorsEntry& entry : entries) {
    const int64_t bytes = entry_bytes(entry);
    if (shards.empty() || (shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().entries.push_back(entry);
    shard_bytes += bytes;
  }
  if (shards.empty()) shards.emplace_back();
  for (size_t i = 0; i < shards.size(); ++i) {
    shards[i].file = shards.size() == 1 ? std::string(kSingleSafetensorsFile)
                                        : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    shards[i].entries = layout_safetensors(shards[i].entries).entries;
  }
  return shards;
}

std::string safetensors_index_json(const std::vector<SafetensorsShard>& shards) {
  int64_t total = 0;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (const SafetensorsShard& shard : shards) {
    for (const SafetensorsEntry& entry : shard.entries) {
      total += entry_bytes(entry);
      weight_map[entry.name] = shard.file;
    }
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

}  // namespace tessera::checkpoint
