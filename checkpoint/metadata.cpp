// The metadata file: JSON out, strictly validated JSON in.
#include "checkpoint/metadata.h"

#include <algorithm>
#include <string_view>

#include "checkpoint/safetensors.h"
#include "checkpoint/sealed_json.h"

namespace tessera::checkpoint {

namespace {

// Bounds far beyond any real checkpoint that keep every element and byte count
// below 2^53, so no product or sum in the checks below can overflow int64.
constexpr int64_t kMaxExtent = int64_t{1} << 48;    // one dimension, or one byte offset
constexpr int64_t kMaxElements = int64_t{1} << 50;  // one tensor

Shape read_shape(const nlohmann::json& value, const std::string& what, const std::string& source,
                 const std::string& name) {
  TESSERA_CHECK(value.is_array(), "{}: tensor '{}': {} must be an array", source, name, what);
  Shape shape;
  for (const auto& extent : value) {
    // The parser stores every non-negative integer as unsigned.
    TESSERA_CHECK(extent.is_number_unsigned() && extent.get<uint64_t>() < static_cast<uint64_t>(kMaxExtent),
                  "{}: tensor '{}': bad {} entry {}", source, name, what, extent.dump());
    shape.push_back(extent.get<int64_t>());
  }
  return shape;
}

// The number of elements in `shape` (entries in [0, kMaxExtent)); throws when
// above kMaxElements. Any zero extent makes it 0 whatever the others are.
int64_t element_count(const Shape& shape, const std::string& source, const std::string& name) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t count = 1;
  for (const int64_t extent : shape) {
    TESSERA_CHECK(count <= kMaxElements / extent, "{}: tensor '{}': shape {} has more than 2^50 elements", source,
                  name, shape);
    count *= extent;
  }
  return count;
}

DType read_dtype(const std::string& text, const std::string& source, const std::string& name) {
  try {
    return dtype_from_safetensors(text);
  } catch (const Error& error) {
    fail("{}: tensor '{}': {}", source, name, error.what());
  }
}

}  // namespace

std::string CheckpointMetadata::to_json_text() const {
  nlohmann::ordered_json json;
  json["format"] = kFormatName;
  json["format_version"] = kFormatVersion;
  json["step"] = step ? nlohmann::ordered_json(*step) : nlohmann::ordered_json(nullptr);
  json["run_id"] = run_id;
  nlohmann::ordered_json tensor_json = nlohmann::ordered_json::object();
  for (const auto& [name, info] : tensors) {
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const auto& chunk : info.chunks) {
      chunks.push_back({{"file", chunk.file},
                        {"byte_range", {chunk.byte_begin, chunk.byte_end}},
                        {"offsets", chunk.offsets},
                        {"sizes", chunk.sizes},
                        {"crc32c", chunk.crc32c}});
    }
    tensor_json[name] = {{"dtype", std::string(safetensors_dtype(info.dtype))},
                         {"global_shape", info.global_shape},
                         {"chunks", std::move(chunks)}};
  }
  json["tensors"] = std::move(tensor_json);
  json["training_state"] = training_state;
  return seal_json(json);
}

CheckpointMetadata CheckpointMetadata::parse(const std::string& text, const std::string& source) {
  // The seal first: a file changed in any byte is reported as changed, not
  // as whatever its changed bytes now happen to say.
  const nlohmann::json json = parse_sealed_json(text, source);
  TESSERA_CHECK(json.contains("format") && json["format"].is_string() &&
                    json["format"].get<std::string>() == kFormatName,
                "{}: not a tessera checkpoint (format {})", source,
                json.contains("format") ? json["format"].dump() : "missing");
  TESSERA_CHECK(json.contains("format_version") && json["format_version"].is_number_integer(),
                "{}: no format_version", source);
  TESSERA_CHECK(json["format_version"].is_number_unsigned() &&
                    json["format_version"].get<uint64_t>() == static_cast<uint64_t>(kFormatVersion),
                "{}: format version {}; this tessera reads version {}", source, json["format_version"].dump(),
                kFormatVersion);
  TESSERA_CHECK(json.contains("tensors") && json["tensors"].is_object(), "{}: no tensors object", source);

  CheckpointMetadata metadata;
  if (json.contains("step") && !json["step"].is_null()) {
    TESSERA_CHECK(json["step"].is_number_unsigned() && json["step"].get<uint64_t>() < static_cast<uint64_t>(kMaxExtent),
                  "{}: step must be a non-negative integer or null, got {}", source,
                  json["step"].dump());
    metadata.step = json["step"].get<int64_t>();
  }
  if (json.contains("run_id")) {
    TESSERA_CHECK(json["run_id"].is_string(), "{}: run_id must be a string, got {}", source, json["run_id"].dump());
    metadata.run_id = json["run_id"].get<std::string>();
  }
  if (json.contains("training_state")) metadata.training_state = json["training_state"];
  for (const auto& [name, value] : json["tensors"].items()) {
    TESSERA_CHECK(value.is_object() && value.contains("dtype") && value["dtype"].is_string() &&
                      value.contains("chunks") && value["chunks"].is_array(),
                  "{}: tensor '{}' needs dtype and chunks", source, name);
    TensorInfo info;
    info.dtype = read_dtype(value["dtype"].get<std::string>(), source, name);
    info.global_shape = read_shape(value.value("global_shape", nlohmann::json()), "global_shape", source, name);
    const int64_t numel = element_count(info.global_shape, source, name);
    const int64_t element = static_cast<int64_t>(element_size(info.dtype));
    int64_t covered = 0;
    for (const auto& chunk_json : value["chunks"]) {
      TESSERA_CHECK(chunk_json.is_object() && chunk_json.contains("file") && chunk_json["file"].is_string() &&
                        chunk_json.contains("byte_range") && chunk_json["byte_range"].is_array() &&
                        chunk_json["byte_range"].size() == 2 && chunk_json.contains("crc32c") &&
                        chunk_json["crc32c"].is_array(),
                    "{}: tensor '{}' has a malformed chunk", source, name);
      ChunkInfo chunk;
      chunk.file = chunk_json["file"].get<std::string>();
      // A NUL would end the name early when the file is opened.
      TESSERA_CHECK(!chunk.file.empty() && chunk.file != "." && chunk.file != ".." &&
                        chunk.file.find_first_of(std::string_view("/\0", 2)) == std::string::npos,
                    "{}: tensor '{}': chunk file {} is not a plain file name", source, name,
                    chunk_json["file"].dump());
      const Shape range = read_shape(chunk_json["byte_range"], "byte_range", source, name);
      chunk.byte_begin = range[0];
      chunk.byte_end = range[1];
      chunk.offsets = read_shape(chunk_json.value("offsets", nlohmann::json()), "offsets", source, name);
      chunk.sizes = read_shape(chunk_json.value("sizes", nlohmann::json()), "sizes", source, name);
      for (const auto& crc : chunk_json["crc32c"]) {
        TESSERA_CHECK(crc.is_number_unsigned() && crc.get<uint64_t>() <= 0xFFFFFFFFull,
                      "{}: tensor '{}' has a bad checksum {}", source, name, crc.dump());
        chunk.crc32c.push_back(crc.get<uint32_t>());
      }
      TESSERA_CHECK(chunk.offsets.size() == info.global_shape.size() && chunk.sizes.size() == info.global_shape.size(),
                    "{}: tensor '{}': a chunk's offsets/sizes do not have {} dims", source, name,
                    info.global_shape.size());
      for (size_t d = 0; d < info.global_shape.size(); ++d) {
        TESSERA_CHECK(chunk.offsets[d] + chunk.sizes[d] <= info.global_shape[d],
                      "{}: tensor '{}': chunk at {} of size {} leaves the global shape {}", source, name,
                      chunk.offsets, chunk.sizes, info.global_shape);
      }
      // Inside the tensor, so at most `numel` elements.
      const int64_t chunk_numel = element_count(chunk.sizes, source, name);
      TESSERA_CHECK(chunk.byte_end - chunk.byte_begin == chunk_numel * element,
                    "{}: tensor '{}': chunk in {} has {} bytes for sizes {}", source, name, chunk.file,
                    chunk.byte_end - chunk.byte_begin, chunk.sizes);
      const int64_t blocks = (chunk.byte_end - chunk.byte_begin + kChecksumBlock - 1) / kChecksumBlock;
      TESSERA_CHECK(static_cast<int64_t>(chunk.crc32c.size()) == blocks,
                    "{}: tensor '{}': a chunk of {} bytes needs {} checksums, has {}", source, name,
                    chunk.byte_end - chunk.byte_begin, blocks, chunk.crc32c.size());
      covered += chunk_numel;
      TESSERA_CHECK(covered <= numel, "{}: tensor '{}': its chunks hold more than its {} elements (overlap?)", source,
                    name, numel);
      info.chunks.push_back(std::move(chunk));
    }
    // Disjoint chunks inside the tensor that add up to its size tile it
    // (empty chunks may sit anywhere).
    for (size_t a = 0; a < info.chunks.size(); ++a) {
      const ChunkInfo& x = info.chunks[a];
      if (x.byte_end == x.byte_begin) continue;
      for (size_t b = a + 1; b < info.chunks.size(); ++b) {
        const ChunkInfo& y = info.chunks[b];
        if (y.byte_end == y.byte_begin) continue;
        bool overlap = true;
        for (size_t d = 0; d < info.global_shape.size(); ++d) {
          overlap = overlap && x.offsets[d] < y.offsets[d] + y.sizes[d] && y.offsets[d] < x.offsets[d] + x.sizes[d];
        }
        TESSERA_CHECK(!overlap, "{}: tensor '{}': the chunks at {} and {} overlap", source, name, x.offsets,
                      y.offsets);
      }
    }
    TESSERA_CHECK(covered == numel, "{}: tensor '{}': the chunks hold {} of its {} elements (a missing rank file?)",
                  source, name, covered, numel);
    metadata.tensors.emplace(name, std::move(info));
  }
  return metadata;
}

void CheckpointMetadata::check_rank_file_header(const std::string& file, const SafetensorsHeader& header,
                                                const std::string& path) const {
  std::map<std::string, const SafetensorsEntry*> unmatched;
  for (const SafetensorsEntry& entry : header.entries) unmatched[entry.name] = &entry;
  std::vector<std::string> differences;
  for (const auto& [name, info] : tensors) {
    for (const ChunkInfo& chunk : info.chunks) {
      if (chunk.file != file) continue;
      const auto found = unmatched.find(name);
      if (found == unmatched.end()) {
        differences.push_back(fmt::format("'{}' is not in the file", name));
        continue;
      }
      const SafetensorsEntry& entry = *found->second;
      unmatched.erase(found);
      if (entry.dtype != info.dtype) {
        differences.push_back(fmt::format("'{}' is {} in the file, {} in the metadata", name,
                                          safetensors_dtype(entry.dtype), safetensors_dtype(info.dtype)));
      }
      if (entry.shape != chunk.sizes) {
        differences.push_back(
            fmt::format("'{}' has shape {} in the file, {} in the metadata", name, entry.shape, chunk.sizes));
      }
      const int64_t begin = header.data_offset + entry.begin;
      const int64_t end = header.data_offset + entry.end;
      if (begin != chunk.byte_begin || end != chunk.byte_end) {
        differences.push_back(fmt::format("'{}' is at bytes [{}, {}) in the file, [{}, {}) in the metadata", name,
                                          begin, end, chunk.byte_begin, chunk.byte_end));
      }
    }
  }
  for (const auto& [name, entry] : unmatched) {
    differences.push_back(fmt::format("'{}' is in the file, not in the metadata", name));
  }
  TESSERA_CHECK(differences.empty(), "{}: its safetensors header disagrees with {} (edited after the save?): {}", path,
                kMetadataFile, fmt::join(differences, "; "));
}

}  // namespace tessera::checkpoint
