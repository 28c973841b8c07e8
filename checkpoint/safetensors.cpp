// Safetensors header parsing (strict), writing, and whole-tensor reads.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>

#include "checkpoint/file_io.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace {

constexpr int64_t kMaxHeaderBytes = 100 << 20;  // the reference implementation's limit

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32"},  {DType::f64, "F64"}, {DType::bf16, "BF16"},
                                     {DType::f16, "F16"},  {DType::i32, "I32"}, {DType::i64, "I64"},
                                     {DType::boolean, "BOOL"}};

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  fail("safetensors: no safetensors name for dtype {}", dtype_name(dtype));
}

DType dtype_from_safetensors(std::string_view name) {
  for (const auto& entry : kDTypeNames) {
    if (entry.name == name) return entry.dtype;
  }
  fail("safetensors: unsupported dtype '{}' (tessera reads F32, F64, BF16, F16, I32, I64, BOOL)", name);
}

const SafetensorsEntry& SafetensorsHeader::entry(const std::string& name, const std::string& source) const {
  for (const auto& candidate : entries) {
    if (candidate.name == name) return candidate;
  }
  fail("{}: no tensor '{}' in the file", source, name);
}

SafetensorsHeader parse_safetensors_header(std::string_view json_text, int64_t data_size, const std::string& source) {
  const nlohmann::json header = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  TESSERA_CHECK(!header.is_discarded() && header.is_object(), "{}: the safetensors header is not a JSON object",
                source);
  SafetensorsHeader parsed;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      TESSERA_CHECK(value.is_object(), "{}: __metadata__ must be an object of strings", source);
      for (const auto& [key, text] : value.items()) {
        TESSERA_CHECK(text.is_string(), "{}: __metadata__ value '{}' is not a string", source, key);
        parsed.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    TESSERA_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                      value.contains("data_offsets") && value["dtype"].is_string() && value["shape"].is_array() &&
                      value["data_offsets"].is_array() && value["data_offsets"].size() == 2,
                  "{}: tensor '{}' needs dtype (string), shape (array) and data_offsets ([begin, end])", source, name);
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = dtype_from_safetensors(value["dtype"].get<std::string>());
    int64_t numel = 1;
    for (const auto& size : value["shape"]) {
      TESSERA_CHECK(size.is_number_unsigned() || (size.is_number_integer() && size.get<int64_t>() >= 0),
                    "{}: tensor '{}' has a bad shape entry {}", source, name, size.dump());
      const int64_t extent = size.get<int64_t>();
      TESSERA_CHECK(extent == 0 || numel <= (int64_t{1} << 50) / std::max<int64_t>(extent, 1),
                    "{}: tensor '{}' has an impossibly large shape", source, name);
      numel *= extent;
      entry.shape.push_back(extent);
    }
    for (const auto& offset : value["data_offsets"]) {
      TESSERA_CHECK(offset.is_number_unsigned() || (offset.is_number_integer() && offset.get<int64_t>() >= 0),
                    "{}: tensor '{}' has a bad data offset {}", source, name, offset.dump());
    }
    entry.begin = value["data_offsets"][0].get<int64_t>();
    entry.end = value["data_offsets"][1].get<int64_t>();
    TESSERA_CHECK(entry.begin <= entry.end && entry.end <= data_size,
                  "{}: tensor '{}' spans bytes [{}, {}) but the data section has {} bytes (truncated file?)", source,
                  name, entry.begin, entry.end, data_size);
    TESSERA_CHECK(entry.end - entry.begin == numel * static_cast<int64_t>(element_size(entry.dtype)),
                  "{}: tensor '{}' has {} bytes for shape {} of {}", source, name, entry.end - entry.begin, entry.shape,
                  dtype_name(entry.dtype));
    parsed.entries.push_back(std::move(entry));
  }
  std::sort(parsed.entries.begin(), parsed.entries.end(),
            [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  int64_t expected = 0;
  for (const auto& entry : parsed.entries) {
    TESSERA_CHECK(entry.begin == expected, "{}: tensor '{}' starts at byte {}, expected {} (overlap or gap)", source,
                  entry.name, entry.begin, expected);
    expected = entry.end;
  }
  TESSERA_CHECK(expected == data_size, "{}: the tensors cover {} bytes of a {}-byte data section", source, expected,
                data_size);
  return parsed;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  ReadFile file(path);
  const int64_t size = file.size();
  TESSERA_CHECK(size >= 8, "{}: {} bytes is too short for a safetensors file (truncated?)", path, size);
  uint64_t header_bytes = 0;
  file.read_at(0, &header_bytes, 8);
  TESSERA_CHECK(header_bytes <= static_cast<uint64_t>(kMaxHeaderBytes) && header_bytes <= static_cast<uint64_t>(size - 8),
                "{}: the header claims {} bytes in a {}-byte file (not safetensors, or truncated)", path, header_bytes,
                size);
  std::string text(static_cast<size_t>(header_bytes), '\0');
  file.read_at(8, text.data(), static_cast<int64_t>(header_bytes));
  const int64_t data_offset = 8 + static_cast<int64_t>(header_bytes);
  SafetensorsHeader header = parse_safetensors_header(text, size - data_offset, path);
  header.data_offset = data_offset;
  return header;
}

SafetensorsHeader write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata, bool sync) {
  SafetensorsHeader header;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TESSERA_CHECK(name != "__metadata__" && !name.empty(), "write_safetensors: bad tensor name '{}'", name);
    TESSERA_CHECK(tensor.defined() && tensor.device().is_cpu(), "write_safetensors: tensor '{}' must be a cpu tensor",
                  name);
    SafetensorsEntry entry{name, tensor.dtype(), tensor.sizes(), offset, offset + tensor.nbytes()};
    json[name] = {{"dtype", std::string(safetensors_dtype(entry.dtype))}, {"shape", entry.shape},
                  {"data_offsets", {entry.begin, entry.end}}};
    offset = entry.end;
    header.entries.push_back(std::move(entry));
  }
  header.metadata = metadata;
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  header.data_offset = 8 + static_cast<int64_t>(text.size());

  WriteFile file(path);
  const uint64_t length = text.size();
  file.write(&length, 8);
  file.write(text.data(), static_cast<int64_t>(text.size()));
  for (const auto& [name, tensor] : tensors) {
    const Tensor dense = ops::contiguous(tensor);
    if (dense.nbytes() > 0) file.write(dense.raw_data(), dense.nbytes());
  }
  file.close(sync);
  return header;
}

Tensor read_safetensors_tensor(const std::string& path, const std::string& name) {
  const SafetensorsHeader header = read_safetensors_header(path);
  const SafetensorsEntry& entry = header.entry(name, path);
  Tensor tensor = ops::empty(entry.shape, {.dtype = entry.dtype});
  if (tensor.nbytes() > 0) ReadFile(path).read_at(header.data_offset + entry.begin, tensor.raw_data(), tensor.nbytes());
  return tensor;
}

}  // namespace tessera::checkpoint
