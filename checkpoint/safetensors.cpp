// Safetensors header parsing (to the reference implementation's rules),
// streamed writing, and whole-tensor reads.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxHeaderBytes = 100'000'000;  // the reference's MAX_HEADER_SIZE, decimal
// Bounds far beyond any real file that keep byte counts below 2^53, so no
// product or difference in the checks below can overflow int64.
constexpr uint64_t kMaxTensorElements = uint64_t{1} << 50;  // one tensor, and one extent
constexpr uint64_t kMaxOffset = uint64_t{1} << 52;    // bytes into the data section
// serde_json, the reference's JSON parser, refuses a 128th nested container.
// The bound also keeps copying or printing a value (which recurse once per
// level) far from the end of the stack.
constexpr int kMaxHeaderJsonDepth = 127;

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32"},  {DType::f64, "F64"}, {DType::bf16, "BF16"},
                                     {DType::f16, "F16"},  {DType::i32, "I32"}, {DType::i64, "I64"},
                                     {DType::boolean, "BOOL"}, {DType::u8, "U8"},
                                     {DType::f8e4m3, "F8_E4M3"}, {DType::f8e5m2, "F8_E5M2"}};
// Every dtype of the format (safetensors 0.8.0). The ones tessera has no type
// for (I8, F8_E8M0, ...) are refused by name, not as unknown.
constexpr std::string_view kFormatDTypes[] = {
    "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
    "I16",  "U16", "F16",     "BF16",    "I32", "U32", "F32",     "C64",     "F64",     "I64",         "U64"};

// The index of the first byte of `text` that does not belong to well-formed
// UTF-8 as Rust's str::from_utf8 defines it (no overlong forms, no
// surrogates, nothing past U+10FFFF), or npos.
size_t first_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<uint8_t>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint8_t low = 0x80, high = 0xBF;  // the range of the second byte
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;   // shorter forms exist
      if (lead == 0xED) high = 0x9F;  // U+D800..U+DFFF are surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
    } else {
      return i;
    }
    if (text.size() - i < length) return i;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<uint8_t>(text[i + k]);
      if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

// The header's JSON as one value, built from the parser's events so that the
// reference's rules beyond JSON syntax can hold: at most kMaxHeaderJsonDepth nested
// containers, and a key that an object holds twice kept aside rather than
// silently replaced, since serde checks the earlier value of a map's key
// before the last one wins, and refuses a struct's field twice.
class HeaderJsonBuilder {
 public:
  Json root;
  // The earlier values of keys given twice, by the object that holds them (an
  // object's storage stays put while the values around it move).
  std::map<const Json::object_t*, std::vector<std::pair<std::string, Json>>> shadowed;
  std::string error;           // why parsing stopped, when it did
  bool syntax_error = false;   // not JSON at all; then:
  size_t syntax_error_at = 0;  // the byte of the text where the parser saw it

  bool null() { return add(Json(nullptr)); }
  bool boolean(bool value) { return add(Json(value)); }
  bool number_integer(Json::number_integer_t value) { return add(Json(value)); }
  bool number_unsigned(Json::number_unsigned_t value) { return add(Json(value)); }
  bool number_float(Json::number_float_t value, const Json::string_t&) { return add(Json(value)); }
  bool string(Json::string_t& value) { return add(Json(std::move(value))); }
  bool binary(Json::binary_t&) { return stop("has a binary value, which JSON text cannot hold"); }
  bool start_object(size_t) { return open(Json::object()); }
  bool start_array(size_t) { return open(Json::array()); }
  bool key(Json::string_t& key) {
    key_ = std::move(key);
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(size_t position, const std::string&, const Json::exception& exception) {
    syntax_error = true;
    syntax_error_at = position > 0 ? position - 1 : 0;  // the parser counts bytes read
    return stop(exception.what());
  }

 private:
  Json* place(Json value) {
    if (open_.empty()) {
      root = std::move(value);
      return &root;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    Json::object_t& members = parent.get_ref<Json::object_t&>();
    const auto [slot, inserted] = members.try_emplace(key_);
    if (!inserted) shadowed[&members].emplace_back(key_, std::move(slot->second));
    slot->second = std::move(value);
    return &slot->second;
  }
  bool add(Json value) {
    place(std::move(value));
    return true;
  }
  bool open(Json container) {
    if (open_.size() == static_cast<size_t>(kMaxHeaderJsonDepth)) {
      return stop(fmt::format("nests deeper than {} levels (the reference parser's limit)", kMaxHeaderJsonDepth));
    }
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }
  bool stop(std::string why) {
    error = std::move(why);
    return false;
  }

  std::vector<Json*> open_;  // the containers not yet closed, outermost first
  std::string key_;          // the key of the next member of the innermost object
};

// A JSON value for a message: at most 40 characters of it.
std::string excerpt(const Json& value) {
  if (value.is_number_integer() && !value.is_number_unsigned() && value == 0) return "-0";  // parsed as signed 0
  const std::string text = value.dump();
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

// A tensor entry as the header states it, before tessera's own limits.
struct StatedEntry {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Reads the header's members by the reference's schema: {"__metadata__":
// {string: string} or null, NAME: {"dtype", "shape", "data_offsets", any
// other field ignored}}, a tensor entry also as [dtype, shape, data_offsets]
// and a dtype also as {"NAME": null} (serde's other forms of a struct and an enum).
class HeaderSchema {
 public:
  HeaderSchema(const HeaderJsonBuilder& json, const std::string& source, int64_t header_end)
      : json_(json), source_(source), where_(fmt::format("header bytes [8, {})", header_end)) {}

  std::map<std::string, std::string> metadata(const Json& value) const {
    std::map<std::string, std::string> metadata;
    if (value.is_null()) return metadata;
    TESSERA_CHECK(value.is_object(), "{}: __metadata__ is {} ({}); it must be an object of strings, or null", source_,
                  value.type_name(), where_);
    for (const auto& [key, text] : shadowed_of(value)) check_metadata_value(key, text);
    for (const auto& [key, text] : value.items()) {
      check_metadata_value(key, text);
      metadata[key] = text.get<std::string>();
    }
    return metadata;
  }

  StatedEntry entry(const std::string& name, const Json& value) const {
    StatedEntry stated;
    stated.name = name;
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    if (value.is_array()) {
      TESSERA_CHECK(value.size() == 3, "{}: tensor '{}' is an array of {} values ({}); as an array an entry is [dtype, "
                    "shape, data_offsets]", source_, name, value.size(), where_);
      dtype = &value[0];
      shape = &value[1];
      offsets = &value[2];
    } else {
      TESSERA_CHECK(value.is_object(), "{}: tensor '{}' is {} ({}); an entry is {{\"dtype\", \"shape\", "
                    "\"data_offsets\"}}", source_, name, value.type_name(), where_);
      for (const auto& [key, ignored] : shadowed_of(value)) {
        TESSERA_CHECK(key != "dtype" && key != "shape" && key != "data_offsets",
                      "{}: tensor '{}' has \"{}\" twice ({})", source_, name, key, where_);
      }
      dtype = required_field(name, value, "dtype");
      shape = required_field(name, value, "shape");
      offsets = required_field(name, value, "data_offsets");
    }
    stated.dtype = dtype_name_of(name, *dtype);
    TESSERA_CHECK(shape->is_array(), "{}: tensor '{}' has a shape that is {} ({}); it must be an array of extents",
                  source_, name, shape->type_name(), where_);
    for (const Json& extent : *shape) {
      // The JSON parser stores every integer without a minus sign as unsigned.
      TESSERA_CHECK(extent.is_number_unsigned(), "{}: tensor '{}' has a bad shape entry {} ({}); extents are "
                    "integers from 0", source_, name, excerpt(extent), where_);
      stated.shape.push_back(extent.get<uint64_t>());
    }
    TESSERA_CHECK(offsets->is_array() && offsets->size() == 2,
                  "{}: tensor '{}' has data_offsets {} ({}); they must be [begin, end]", source_, name,
                  excerpt(*offsets), where_);
    for (const Json& offset : *offsets) {
      TESSERA_CHECK(offset.is_number_unsigned(), "{}: tensor '{}' has a bad data offset {} ({}); offsets are "
                    "integers from 0", source_, name, excerpt(offset), where_);
    }
    stated.begin = (*offsets)[0].get<uint64_t>();
    stated.end = (*offsets)[1].get<uint64_t>();
    return stated;
  }

 private:
  const std::vector<std::pair<std::string, Json>>& shadowed_of(const Json& object) const {
    static const std::vector<std::pair<std::string, Json>> none;
    const auto found = json_.shadowed.find(&object.get_ref<const Json::object_t&>());
    return found == json_.shadowed.end() ? none : found->second;
  }

  void check_metadata_value(const std::string& key, const Json& text) const {
    TESSERA_CHECK(text.is_string(), "{}: __metadata__ value '{}' is {}, not a string ({}); metadata maps strings to "
                  "strings", source_, key, text.type_name(), where_);
  }

  const Json* required_field(const std::string& name, const Json& entry, const char* key) const {
    const auto found = entry.find(key);
    TESSERA_CHECK(found != entry.end(), "{}: tensor '{}' has no \"{}\" ({}); an entry needs dtype, shape and "
                  "data_offsets", source_, name, key, where_);
    return &*found;
  }

  // "F32" or {"F32": null}, naming one of the format's dtypes.
  std::string dtype_name_of(const std::string& name, const Json& dtype) const {
    std::string text;
    if (dtype.is_string()) {
      text = dtype.get<std::string>();
    } else {
      TESSERA_CHECK(dtype.is_object() && dtype.size() == 1 && shadowed_of(dtype).empty() &&
                        dtype.begin().value().is_null(),
                    "{}: tensor '{}' has dtype {} ({}); a dtype is a name such as \"F32\" (or {{\"F32\": null}})",
                    source_, name, excerpt(dtype), where_);
      text = dtype.begin().key();
    }
    TESSERA_CHECK(std::find(std::begin(kFormatDTypes), std::end(kFormatDTypes), text) != std::end(kFormatDTypes),
                  "{}: tensor '{}' has dtype '{}', which is not a safetensors dtype ({}); the format's are {}", source_,
                  name, text, where_, fmt::join(kFormatDTypes, ", "));
    return text;
  }

  const HeaderJsonBuilder& json_;
  const std::string& source_;
  std::string where_;
};

// A stated entry as tessera holds it: a dtype tessera has and extents within
// its bounds. The element count is multiplied in order, as the reference
// does (and shape_numel after it): a shape that overflows there is refused,
// though an empty one such as [0, 2^50, 2^50] never overflows.
SafetensorsEntry tessera_entry(const StatedEntry& stated, const std::string& source, const std::string& where) {
  SafetensorsEntry entry;
  entry.name = stated.name;
  try {
    entry.dtype = dtype_from_safetensors(stated.dtype);
  } catch (const Error& error) {
    fail("{}: tensor '{}': {} ({}); the format has it, tessera has no type for it", source, stated.name, error.what(),
         where);
  }
  int64_t numel = 1;
  bool overflow = false;
  for (const uint64_t extent : stated.shape) {
    TESSERA_CHECK(extent <= kMaxTensorElements, "{}: tensor '{}' has a bad shape entry {} ({}); tessera's extents stop at "
                  "2^50", source, stated.name, extent, where);
    entry.shape.push_back(static_cast<int64_t>(extent));
    overflow = overflow || __builtin_mul_overflow(numel, entry.shape.back(), &numel);
  }
  TESSERA_CHECK(!overflow, "{}: tensor '{}' has shape {} ({}), whose element count overflows 64-bit integers when "
                "its extents are multiplied in order", source, stated.name, entry.shape, where);
  TESSERA_CHECK(static_cast<uint64_t>(numel) <= kMaxTensorElements,
                "{}: tensor '{}' has an impossibly large shape {} (over 2^50 elements) ({})", source, stated.name,
                entry.shape, where);
  for (const uint64_t offset : {stated.begin, stated.end}) {
    TESSERA_CHECK(offset <= kMaxOffset, "{}: tensor '{}' has a bad data offset {} ({}); tessera's offsets stop at "
                  "2^52", source, stated.name, offset, where);
  }
  entry.begin = static_cast<int64_t>(stated.begin);
  entry.end = static_cast<int64_t>(stated.end);
  return entry;
}

// Checks that `entries`, in data order, tile [0, data_size) of the data
// section (which starts at file byte `data_start`) and that each one's bytes
// are what its shape and dtype need.
void check_tiling(const std::vector<SafetensorsEntry>& entries, int64_t data_start, int64_t data_size,
                  const std::string& source) {
  int64_t expected = 0;
  for (const SafetensorsEntry& entry : entries) {
    const std::string span = fmt::format("tensor '{}': data_offsets [{}, {}) (file bytes [{}, {}))", entry.name,
                                         entry.begin, entry.end, data_start + entry.begin, data_start + entry.end);
    TESSERA_CHECK(entry.begin >= expected, "{}: {} start inside the tensor before it, which ends at {}: the tensors "
                  "must tile the data section with no overlap", source, span, expected);
    TESSERA_CHECK(entry.begin == expected, "{}: {} leave bytes [{}, {}) of the data section unused: the tensors must "
                  "tile the data section with no gap", source, span, expected, entry.begin);
    TESSERA_CHECK(entry.end >= entry.begin, "{}: {} end before they begin", source, span);
    const int64_t bytes = shape_numel(entry.shape) * static_cast<int64_t>(element_size(entry.dtype));
    TESSERA_CHECK(entry.end - entry.begin == bytes, "{}: {} hold {} bytes, but shape {} of {} needs {}", source, span,
                  entry.end - entry.begin, entry.shape, dtype_name(entry.dtype), bytes);
    TESSERA_CHECK(entry.end <= data_size, "{}: {} run past the {}-byte data section (truncated file?)", source, span,
                  data_size);
    expected = entry.end;
  }
  TESSERA_CHECK(expected == data_size, "{}: the tensors end at byte {} of the {}-byte data section (which starts at "
                "file byte {}): the last tensor must end where the file does", source, expected, data_size,
                data_start);
}

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
  const int64_t data_start = 8 + static_cast<int64_t>(json_text.size());
  const std::string where = fmt::format("header bytes [8, {})", data_start);
  const size_t bad_byte = first_invalid_utf8(json_text);
  TESSERA_CHECK(bad_byte == std::string_view::npos, "{}: {} are not UTF-8: file byte {} (0x{:02x}) is not part of a "
                "UTF-8 character", source, where, 8 + bad_byte, static_cast<uint8_t>(json_text[bad_byte]));
  // nlohmann's parser skips a byte-order mark and stops at a NUL byte as if
  // the text ended there; serde_json, like JSON itself, refuses both.
  TESSERA_CHECK(!json_text.starts_with("\xEF\xBB\xBF"), "{}: {} start with a byte-order mark, which is not JSON",
                source, where);
  const size_t nul = json_text.find('\0');
  TESSERA_CHECK(nul == std::string_view::npos, "{}: {} hold a NUL byte at file byte {}, which JSON does not allow "
                "(a header is padded with spaces)", source, where, 8 + nul);
  HeaderJsonBuilder json;
  if (!Json::sax_parse(json_text.begin(), json_text.end(), &json, Json::input_format_t::json, /*strict=*/true,
                       /*ignore_comments=*/false)) {
    TESSERA_CHECK(!json.syntax_error, "{}: {} are not JSON (near file byte {}): {}", source, where,
                  8 + json.syntax_error_at, json.error);
    fail("{}: the safetensors header {} ({})", source, json.error, where);
  }
  TESSERA_CHECK(json.root.is_object(), "{}: the safetensors header is not a JSON object ({} hold {})", source, where,
                json.root.type_name());

  // A name stated twice: every statement must be an entry; the last one holds.
  const HeaderSchema schema(json, source, data_start);
  SafetensorsHeader parsed;
  if (const auto twice = json.shadowed.find(&json.root.get_ref<const Json::object_t&>()); twice != json.shadowed.end()) {
    for (const auto& [name, value] : twice->second) {
      TESSERA_CHECK(name != "__metadata__", "{}: the header has \"__metadata__\" twice ({})", source, where);
      schema.entry(name, value);
    }
  }
  std::vector<StatedEntry> stated;
  for (const auto& [name, value] : json.root.items()) {
    if (name == "__metadata__") {
      parsed.metadata = schema.metadata(value);
    } else {
      stated.push_back(schema.entry(name, value));
    }
  }
  for (const StatedEntry& entry : stated) parsed.entries.push_back(tessera_entry(entry, source, where));
  std::sort(parsed.entries.begin(), parsed.entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_tiling(parsed.entries, data_start, data_size, source);
  return parsed;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  ReadFile file(path);
  const int64_t size = file.size();
  TESSERA_CHECK(size >= 8, "{}: {} bytes is too short for a safetensors file (truncated?): it starts with an 8-byte "
                "header length", path, size);
  uint64_t header_bytes = 0;
  file.read_at(0, &header_bytes, 8);
  TESSERA_CHECK(header_bytes <= static_cast<uint64_t>(kMaxHeaderBytes), "{}: bytes [0, 8) give a header length of {}, "
                "over the format's limit of {} bytes (not safetensors?)", path, header_bytes, kMaxHeaderBytes);
  TESSERA_CHECK(header_bytes <= static_cast<uint64_t>(size - 8), "{}: bytes [0, 8) give a header length of {}, but "
                "{} bytes follow them (not safetensors, or truncated)", path, header_bytes, size - 8);
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
