// Sealed JSON: a JSON file that carries the CRC-32C of its own bytes, so that
// any change after it was written (a flipped bit, a hand edit, a torn copy)
// is found before the file is trusted. checkpoint metadata.json and a
// checkpoint root's run.json are sealed. The file is the JSON object as
// written, with one last member appended:
//
//   { ...members..., "crc32c": N }      N = CRC-32C of every byte before `"crc32c"`
//
// Checking the raw bytes, not a re-serialisation, keeps old files valid when
// the JSON library later formats numbers differently.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tessera::checkpoint {

// The text of `object` (a JSON object without a "crc32c" member), sealed.
std::string seal_json(const nlohmann::ordered_json& object);

// Verifies the seal of `text` and parses it (nested at most 64 levels deep:
// copying deeper JSON recurses once per level). Errors name `source`: not
// JSON, not an object, no seal, or a seal that does not match the bytes.
nlohmann::json parse_sealed_json(const std::string& text, const std::string& source);

// The file at `path`, read and checked by parse_sealed_json.
nlohmann::json read_sealed_json_file(const std::string& path);

// Writes seal_json(object) to `path` atomically: PATH.tmp, fsync, rename.
void write_sealed_json_file(const std::string& path, const nlohmann::ordered_json& object, bool sync);

}  // namespace tessera::checkpoint
