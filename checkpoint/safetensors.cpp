// Safetensors header parsing (strict), streamed writing, and whole-tensor reads.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace {

constexpr int64_t kMaxHeaderBytes = 100 << 20;  // the reference implementation's limit
// Bounds far beyond any real file that keep byte counts below 2^53, so no
// product or difference in the checks below can overflow int64.
constexpr uint64_t kMaxElements = uint64_t{1} << 50;  // one tensor
constexpr uint64_t kMaxOffset = uint64_t{1} << 52;    // bytes into the data section
// A header is three levels deep; copying or printing a JSON value recurses
// once per level, so a 100 MB header of '[' would overflow the stack.
constexpr int kMaxJsonDepth = 16;

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
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    TESSERA_CHECK(depth < kMaxJsonDepth, "{}: the safetensors header nests deeper than {} levels", source,
                  kMaxJsonDepth);
    return true;
  };
  const nlohmann::json header = nlohmann::json::parse(json_text, limit_depth, /*allow_exceptions=*/false);
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
    try {
      entry.dtype = dtype_from_safetensors(value["dtype"].get<std::string>());
    } catch (const Error& error) {
      fail("{}: tensor '{}': {}", source, name, error.what());
    }
    for (const auto& size : value["shape"]) {
      // The JSON parser stores every non-negative integer as unsigned.
      TESSERA_CHECK(size.is_number_unsigned() && size.get<uint64_t>() <= kMaxElements,
                    "{}: tensor '{}' has a bad shape entry {}", source, name, size.dump());
      entry.shape.push_back(size.get<int64_t>());
    }
    // Any zero extent makes the tensor empty whatever the others are.
    uint64_t numel = std::count(entry.shape.begin(), entry.shape.end(), 0) > 0 ? 0 : 1;
    for (const int64_t extent : entry.shape) {
      TESSERA_CHECK(numel <= kMaxElements / static_cast<uint64_t>(std::max<int64_t>(extent, 1)),
                    "{}: tensor '{}' has an impossibly large shape {} (over 2^50 elements)", source, name,
                    entry.shape);
      numel *= static_cast<uint64_t>(extent);
    }
    for (const auto& offset : value["data_offsets"]) {
      TESSERA_CHECK(offset.is_number_unsigned() && offset.get<uint64_t>() <= kMaxOffset,
                    "{}: tensor '{}' has a bad data offset {}", source, name, offset.dump());
    }
    entry.begin = value["data_offsets"][0].get<int64_t>();
    entry.end = value["data_offsets"][1].get<int64_t>();
    TESSERA_CHECK(entry.begin <= entry.end && entry.end <= data_size,
                  "{}: tensor '{}' spans bytes [{}, {}) but the data section has {} bytes (truncated file?)", source,
                  name, entry.begin, entry.end, data_size);
    const int64_t bytes = static_cast<int64_t>(numel) * static_cast<int64_t>(element_size(entry.dtype));
    TESSERA_CHECK(entry.end - entry.begin == bytes, "{}: tensor '{}' has {} bytes for shape {} of {}", source, name,
                  entry.end - entry.begin, entry.shape, dtype_name(entry.dtype));
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

namespace {

// The header's JSON (metadata first, then the entries in data order), padded
// with spaces to a multiple of 8 so the data section stays aligned.
std::string header_text(const SafetensorsHeader& header) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!header.metadata.empty()) json["__metadata__"] = header.metadata;
  for (const auto& entry : header.entries) {
    json[entry.name] = {{"dtype", std::string(safetensors_dtype(entry.dtype))}, {"shape", entry.shape},
                        {"data_offsets", {entry.begin, entry.end}}};
  }
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

SafetensorsHeader layout_safetensors(std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata) {
  SafetensorsHeader header;
  header.metadata = metadata;
  std::set<std::string> names;
  int64_t offset = 0;
  for (auto& entry : entries) {
    TESSERA_CHECK(entry.name != "__metadata__" && !entry.name.empty(), "safetensors: bad tensor name '{}'", entry.name);
    TESSERA_CHECK(names.insert(entry.name).second, "safetensors: tensor '{}' appears twice", entry.name);
    entry.begin = offset;
    entry.end = offset + shape_numel(entry.shape) * static_cast<int64_t>(element_size(entry.dtype));
    offset = entry.end;
  }
  header.entries = std::move(entries);
  const int64_t text_bytes = static_cast<int64_t>(header_text(header).size());
  TESSERA_CHECK(text_bytes <= kMaxHeaderBytes, "safetensors: a header of {} bytes exceeds the format's limit of {}",
                text_bytes, kMaxHeaderBytes);
  header.data_offset = 8 + text_bytes;
  return header;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, SafetensorsHeader header)
    : path_(path), header_(std::move(header)), file_(path) {
  const std::string text = header_text(header_);
  TESSERA_CHECK(8 + static_cast<int64_t>(text.size()) == header_.data_offset,
                "{}: the header was not laid out by layout_safetensors", path_);
  const uint64_t length = text.size();
  file_.write(&length, 8);
  file_.write(text.data(), static_cast<int64_t>(text.size()));
}

void SafetensorsWriter::append(const Tensor& tensor) {
  TESSERA_CHECK(next_entry_ < header_.entries.size(), "{}: all {} tensors are already written", path_,
                header_.entries.size());
  const SafetensorsEntry& entry = header_.entries[next_entry_];
  TESSERA_CHECK(tensor.defined() && tensor.device().is_cpu(), "{}: tensor '{}' must be a cpu tensor", path_,
                entry.name);
  TESSERA_CHECK(tensor.dtype() == entry.dtype && tensor.sizes() == entry.shape,
                "{}: tensor '{}' is laid out as {} {} but {} {} came", path_, entry.name, dtype_name(entry.dtype),
                entry.shape, dtype_name(tensor.dtype()), tensor.sizes());
  autograd::NoGradGuard no_grad;  // writes the values of tensors that may require grad (live parameters)
  const Tensor dense = ops::contiguous(tensor);
  if (dense.nbytes() > 0) file_.write(dense.raw_data(), dense.nbytes());
  ++next_entry_;
}

void SafetensorsWriter::close(bool sync) {
  TESSERA_CHECK(next_entry_ == header_.entries.size(), "{}: closed after {} of {} tensors", path_, next_entry_,
                header_.entries.size());
  file_.close(sync);
}

SafetensorsHeader write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata, bool sync) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, tensor] : tensors) {
    TESSERA_CHECK(tensor.defined() && tensor.device().is_cpu(), "write_safetensors: tensor '{}' must be a cpu tensor",
                  name);
    entries.push_back({name, tensor.dtype(), tensor.sizes()});
  }
  SafetensorsWriter writer(path, layout_safetensors(std::move(entries), metadata));
  for (const auto& [name, tensor] : tensors) writer.append(tensor);
  writer.close(sync);
  return writer.header();
}

Tensor read_safetensors_tensor(const std::string& path, const std::string& name) {
  const SafetensorsHeader header = read_safetensors_header(path);
  const SafetensorsEntry& entry = header.entry(name, path);
  Tensor tensor = ops::empty(entry.shape, {.dtype = entry.dtype});
  if (tensor.nbytes() > 0) ReadFile(path).read_at(header.data_offset + entry.begin, tensor.raw_data(), tensor.nbytes());
  return tensor;
}

}  // namespace tessera::checkpoint
