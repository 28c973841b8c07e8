// The metadata file: JSON out, strictly validated JSON in.
#include "checkpoint/metadata.h"

#include "checkpoint/safetensors.h"

namespace tessera::checkpoint {

namespace {

Shape read_shape(const nlohmann::json& value, const std::string& what, const std::string& source,
                 const std::string& name) {
  TESSERA_CHECK(value.is_array(), "{}: tensor '{}': {} must be an array", source, name, what);
  Shape shape;
  for (const auto& extent : value) {
    TESSERA_CHECK(extent.is_number_integer() && extent.get<int64_t>() >= 0 && extent.get<int64_t>() < (int64_t{1} << 48),
                  "{}: tensor '{}': bad {} entry {}", source, name, what, extent.dump());
    shape.push_back(extent.get<int64_t>());
  }
  return shape;
}

}  // namespace

std::string CheckpointMetadata::to_json_text() const {
  nlohmann::ordered_json json;
  json["format"] = kFormatName;
  json["format_version"] = kFormatVersion;
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
  return json.dump(1);
}

CheckpointMetadata CheckpointMetadata::parse(const std::string& text, const std::string& source) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TESSERA_CHECK(!json.is_discarded() && json.is_object(), "{}: not a JSON object (corrupt metadata?)", source);
  TESSERA_CHECK(json.value("format", "") == kFormatName, "{}: not a tessera checkpoint (format '{}')", source,
                json.value("format", ""));
  TESSERA_CHECK(json.contains("format_version") && json["format_version"].is_number_integer(),
                "{}: no format_version", source);
  const int version = json["format_version"].get<int>();
  TESSERA_CHECK(version == kFormatVersion, "{}: format version {}; this tessera reads version {}", source, version,
                kFormatVersion);
  TESSERA_CHECK(json.contains("tensors") && json["tensors"].is_object(), "{}: no tensors object", source);

  CheckpointMetadata metadata;
  if (json.contains("training_state")) metadata.training_state = json["training_state"];
  for (const auto& [name, value] : json["tensors"].items()) {
    TESSERA_CHECK(value.is_object() && value.contains("dtype") && value["dtype"].is_string() &&
                      value.contains("chunks") && value["chunks"].is_array(),
                  "{}: tensor '{}' needs dtype and chunks", source, name);
    TensorInfo info;
    info.dtype = dtype_from_safetensors(value["dtype"].get<std::string>());
    info.global_shape = read_shape(value.value("global_shape", nlohmann::json()), "global_shape", source, name);
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
      TESSERA_CHECK(!chunk.file.empty() && chunk.file.find('/') == std::string::npos && chunk.file != "..",
                    "{}: tensor '{}': chunk file '{}' is not a plain file name", source, name, chunk.file);
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
      TESSERA_CHECK(chunk.byte_end - chunk.byte_begin == shape_numel(chunk.sizes) * element,
                    "{}: tensor '{}': chunk in {} has {} bytes for sizes {}", source, name, chunk.file,
                    chunk.byte_end - chunk.byte_begin, chunk.sizes);
      const int64_t blocks = (chunk.byte_end - chunk.byte_begin + kChecksumBlock - 1) / kChecksumBlock;
      TESSERA_CHECK(static_cast<int64_t>(chunk.crc32c.size()) == blocks,
                    "{}: tensor '{}': a chunk of {} bytes needs {} checksums, has {}", source, name,
                    chunk.byte_end - chunk.byte_begin, blocks, chunk.crc32c.size());
      covered += shape_numel(chunk.sizes);
      info.chunks.push_back(std::move(chunk));
    }
    // Disjoint chunks inside the tensor that add up to its size tile it.
    for (size_t a = 0; a < info.chunks.size(); ++a) {
      for (size_t b = a + 1; b < info.chunks.size(); ++b) {
        bool overlap = true;
        for (size_t d = 0; d < info.global_shape.size(); ++d) {
          const auto& x = info.chunks[a];
          const auto& y = info.chunks[b];
          overlap = overlap && x.offsets[d] < y.offsets[d] + y.sizes[d] && y.offsets[d] < x.offsets[d] + x.sizes[d];
        }
        TESSERA_CHECK(!overlap || shape_numel(info.chunks[a].sizes) == 0 || shape_numel(info.chunks[b].sizes) == 0,
                      "{}: tensor '{}': two chunks overlap", source, name);
      }
    }
    TESSERA_CHECK(covered == shape_numel(info.global_shape),
                  "{}: tensor '{}': the chunks hold {} of its {} elements (a missing rank file?)", source, name,
                  covered, shape_numel(info.global_shape));
    metadata.tensors.emplace(name, std::move(info));
  }
  return metadata;
}

}  // namespace tessera::checkpoint
