// Sealing and checking JSON files by the CRC-32C of their bytes.
#include "checkpoint/sealed_json.h"

#include <cctype>
#include <charconv>
#include <filesystem>
#include <string_view>

#include "checkpoint/checksum.h"
#include "checkpoint/file_io.h"
#include "tensor/error.h"

namespace tessera::checkpoint {

namespace {

constexpr std::string_view kSealKey = "\"crc32c\": ";
constexpr std::string_view kSealEnd = "\n}";
constexpr int kMaxJsonDepth = 64;

}  // namespace

std::string seal_json(const nlohmann::ordered_json& object) {
  TESSERA_CHECK(object.is_object() && !object.contains("crc32c"),
                "seal_json: expected a JSON object without a \"crc32c\" member");
  std::string text = object.dump(1);  // "{\n ...\n}", or "{}" when empty
  text.resize(text.size() - 1);       // drop the closing brace
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  text += object.empty() ? "\n " : ",\n ";
  text += kSealKey;
  const uint32_t crc = crc32c(text.data(), text.size());
  return text + std::to_string(crc) + std::string(kSealEnd) + "\n";
}

nlohmann::json parse_sealed_json(const std::string& text, const std::string& source) {
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    TESSERA_CHECK(depth < kMaxJsonDepth, "{}: JSON nested deeper than {} levels (corrupt file?)", source,
                  kMaxJsonDepth);
    return true;
  };
  nlohmann::json json = nlohmann::json::parse(text, limit_depth, /*allow_exceptions=*/false);
  TESSERA_CHECK(!json.is_discarded() && json.is_object(), "{}: not a JSON object (corrupt file?)", source);
  TESSERA_CHECK(json.contains("crc32c"),
                "{}: no \"crc32c\" seal: the file was not written by this tessera (or was rewritten by hand)", source);

  // The seal is the last member: `"crc32c": DIGITS\n}` then optional whitespace.
  const size_t key = text.rfind(kSealKey);
  TESSERA_CHECK(key != std::string::npos, "{}: the \"crc32c\" seal is not where this tessera writes it", source);
  const char* digits = text.data() + key + kSealKey.size();
  const char* end = text.data() + text.size();
  uint32_t stored = 0;
  const auto [after, error] = std::from_chars(digits, end, stored);
  const std::string_view rest(after, static_cast<size_t>(end - after));
  const bool well_placed = error == std::errc() && rest.starts_with(kSealEnd) &&
                           rest.find_first_not_of(" \t\r\n", kSealEnd.size()) == std::string_view::npos;
  TESSERA_CHECK(well_placed && json["crc32c"].is_number_unsigned() && json["crc32c"].get<uint64_t>() == stored,
                "{}: the \"crc32c\" seal is not the file's last member (edited by hand?)", source);
  const uint32_t computed = crc32c(text.data(), key + kSealKey.size());
  TESSERA_CHECK(computed == stored,
                "{}: checksum mismatch (sealed {:08x}, bytes give {:08x}): the file changed after it was written",
                source, stored, computed);
  json.erase("crc32c");
  return json;
}

nlohmann::json read_sealed_json_file(const std::string& path) {
  return parse_sealed_json(read_file_text(path), path);
}

void write_sealed_json_file(const std::string& path, const nlohmann::ordered_json& object, bool sync) {
  const std::string text = seal_json(object);
  const std::string tmp = path + ".tmp";
  WriteFile file(tmp);
  file.write(text.data(), static_cast<int64_t>(text.size()));
  file.close(sync);
  std::filesystem::rename(tmp, path);
  if (sync) sync_directory(std::filesystem::absolute(path).parent_path().string());
}

}  // namespace tessera::checkpoint
