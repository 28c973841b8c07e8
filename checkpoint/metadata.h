// checkpoint::CheckpointMetadata: the one JSON file that describes a
// checkpoint (`metadata.json`, written last by rank 0):
//
//   { "format": "tessera-checkpoint", "format_version": 1,
//     "tensors": { "<name>": { "dtype": "F32", "global_shape": [97, 72],
//         "chunks": [ { "file": "rank-00001.safetensors", "byte_range": [b, e],
//                       "offsets": [25, 0], "sizes": [25, 72], "crc32c": [123, ...] } ] } },
//     "training_state": { ... anything: step, RNG states, data position, config } }
//
// Chunks are boxes of the global tensor (offsets, sizes); byte_range is
// absolute in the chunk's file (a valid .safetensors file whose tensor of the
// same name is exactly those bytes); crc32c lists the CRC-32C of each
// kChecksumBlock-byte block of those bytes (the last one shorter), so a rank
// that reads part of a chunk verifies just the blocks it reads.
// Together the chunks of a tensor tile it exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/tensor.h"

namespace tessera::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "tessera-checkpoint";
inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr int64_t kChecksumBlock = 1 << 20;

struct ChunkInfo {
  std::string file;
  int64_t byte_begin = 0;
  int64_t byte_end = 0;
  Shape offsets;
  Shape sizes;
  std::vector<uint32_t> crc32c;  // one per kChecksumBlock bytes
};

struct TensorInfo {
  DType dtype = DType::f32;
  Shape global_shape;
  std::vector<ChunkInfo> chunks;
};

struct CheckpointMetadata {
  std::map<std::string, TensorInfo> tensors;
  nlohmann::json training_state = nlohmann::json::object();

  std::string to_json_text() const;
  // Parses and validates (format and version, dtypes, every chunk inside its
  // tensor, the chunks tiling it exactly once, byte ranges that match the
  // sizes); errors name `source` and the tensor.
  static CheckpointMetadata parse(const std::string& text, const std::string& source);
};

}  // namespace tessera::checkpoint
