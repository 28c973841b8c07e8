// The .safetensors format, read and written without any other library:
//   8 bytes   little-endian u64 N, the header's length (at most 100,000,000)
//   N bytes   UTF-8 JSON: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
//                    "__metadata__": {"key": "string", ...}}  (written padded with spaces to 8)
//   the data  each tensor's bytes, row-major little-endian, at [b, e) of this section;
//             the ranges tile the section exactly (no gaps, no overlap, nothing after).
// Any tool that reads safetensors (Python's `safetensors`, Rust's crate) opens
// these files. The reader accepts what the reference implementation
// (safetensors 0.8.0) accepts and refuses what it refuses, naming the file,
// the bytes and the rule broken; tests/checkpoint/golden/safetensors_cases
// holds the cases. What it accepts that a glance at the layout above would
// not: JSON whitespace around the object, an entry's fields beyond the three
// (ignored), a name given twice (the last holds), "__metadata__": null, an
// entry as [dtype, shape, data_offsets], a dtype as {"F32": null}. Deliberate
// differences, refused by name: the format's dtypes that tessera has no type
// for (U8, F8_E4M3, ...), and extents over 2^50 (possible in empty tensors).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/file_io.h"
#include "tensor/tensor.h"

namespace tessera::checkpoint {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  int64_t begin = 0;  // byte offsets within the data section
  int64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data order
  std::map<std::string, std::string> metadata;
  int64_t data_offset = 0;  // where the data section starts in the file (8 + N)

  // The entry `name`; throws naming `source` when absent.
  const SafetensorsEntry& entry(const std::string& name, const std::string& source) const;
};

// "F32", "BF16", ...; and back (unknown names throw).
std::string_view safetensors_dtype(DType dtype);
DType dtype_from_safetensors(std::string_view name);

// Parses a header's JSON text (the N bytes after the length) for a data
// section of `data_size` bytes. Every violation (not UTF-8, not JSON, nested
// over 127 deep, a field missing, twice or of the wrong type, a dtype the
// format or tessera lacks, shape and byte size disagreeing, ranges outside the
// data, overlapping or leaving gaps, a non-string metadata value) throws
// tessera::Error naming `source`, the tensor and the file bytes concerned.
SafetensorsHeader parse_safetensors_header(std::string_view json_text, int64_t data_size, const std::string& source);
// Reads and parses the header of the file at `path`.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Lays out `entries` (name, dtype, shape; offsets ignored) in this order:
// fills their byte offsets and the header's data_offset. Names must be
// unique, non-empty and not "__metadata__".
SafetensorsHeader layout_safetensors(std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata = {});

// Writes a laid-out file one tensor at a time, so that a writer never needs
// every tensor in memory at once (the full-model export streams through it).
class SafetensorsWriter {
 public:
  // Creates (or truncates) `path` and writes the header.
  SafetensorsWriter(const std::string& path, SafetensorsHeader header);

  // The bytes of the next entry; `tensor` (cpu, any strides) must have its dtype and shape.
  void append(const Tensor& tensor);
  // Checks that every entry was appended; flushes with fsync when `sync`.
  void close(bool sync);
  const SafetensorsHeader& header() const { return header_; }

 private:
  std::string path_;
  SafetensorsHeader header_;
  WriteFile file_;
  size_t next_entry_ = 0;
};

// Writes `tensors` (any device-cpu tensors; non-contiguous ones are copied)
// in order, with `metadata`, flushing to disk with fsync when `sync`.
// Returns the header as written (offsets included).
SafetensorsHeader write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata = {}, bool sync = true);

// Reads the whole tensor `name` from the file at `path`.
Tensor read_safetensors_tensor(const std::string& path, const std::string& name);

}  // namespace tessera::checkpoint
