// checkpoint::CheckpointMetadata: the one JSON file that describes a
// checkpoint (`metadata.json`, written last by rank 0, sealed: see sealed_json.h):
//
//   { "format": "tessera-checkpoint", "format_version": 2,
//     "step": 400, "run_id": "20261124T101500Z-4f2a9c1e",
//     "tensors": { "<name>": { "dtype": "F32", "global_shape": [97, 72],
//         "chunks": [ { "file": "rank-00001.safetensors", "byte_range": [b, e],
//                       "offsets": [25, 0], "sizes": [25, 72], "crc32c": [123, ...] } ] } },
//     "training_state": { ... anything: step, RNG states, data position, config },
//     "crc32c": 3735928559 }
//
// step and run_id are set when a CheckpointManager saved it (null and ""
// for a plain save): the step must match the step-N directory's name, and the
// run id the root's run.json, or the checkpoint is not the one it claims to be.
//
// Chunks are boxes of the global tensor (offsets, sizes); byte_range is
// absolute in the chunk's file (a valid .safetensors file whose tensor of the
// same name is exactly those bytes); crc32c lists the CRC-32C of each
// kChecksumBlock-byte block of those bytes (the last one shorter), so a rank
// that reads part of a chunk verifies just the blocks it reads. A rank file's
// own header is checked against the chunks instead (check_rank_file_header):
// the file must say of itself what the metadata says of it.
// Together the chunks of a tensor tile it exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/tensor.h"

namespace tessera::checkpoint {

inline constexpr int kFormatVersion = 2;  // 2: sealed, with step and run_id
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

struct SafetensorsHeader;

struct CheckpointMetadata {
  std::optional<int64_t> step;  // the manager's step; nullopt for a plain save
  std::string run_id;           // the manager's run; "" for a plain save
  std::map<std::string, TensorInfo> tensors;
  nlohmann::json training_state = nlohmann::json::object();

  std::string to_json_text() const;
  // Checks the seal, then parses and validates (format and version, dtypes, every chunk inside its
  // tensor, the chunks tiling it exactly once, byte ranges that match the
  // sizes); errors name `source` and the tensor.
  static CheckpointMetadata parse(const std::string& text, const std::string& source);

  // Throws, naming `path` and every difference, unless `header` (of the rank
  // file `file`, read from `path`) holds exactly the chunks stored in that
  // file, each with the tensor's dtype, the chunk's sizes and its byte range.
  // A rank file is a safetensors file of its own, which tools read without
  // the metadata, and no checksum covers its header: an edit there (F32 made
  // I32) would misread the file everywhere but here.
  void check_rank_file_header(const std::string& file, const SafetensorsHeader& header, const std::string& path) const;
};

}  // namespace tessera::checkpoint
