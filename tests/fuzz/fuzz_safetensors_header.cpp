// libFuzzer target for parse_safetensors_header, the reader of a .safetensors
// file's JSON header. An input is 8 bytes (little-endian int64: the size of
// the data section that follows the header in the file) then the header's JSON
// text, so that mutations of the JSON leave the size alone. Any input may be
// rejected, but only with a tessera::Error that names the file; anything else
// (another exception type, a crash, UB, a huge allocation) aborts and
// libFuzzer saves the input. An accepted header must tile the data section.
// Built and run by tests/fuzz/run_fuzzers.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "checkpoint/safetensors.h"

namespace {

constexpr const char* kSource = "fuzz/model.safetensors";

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_safetensors_header: %s: %s\n", what, detail.c_str());
  std::abort();
}

// What parse_safetensors_header promises about everything it accepts.
void check_invariants(const tessera::checkpoint::SafetensorsHeader& header, int64_t data_size) {
  int64_t expected_begin = 0;
  for (const auto& entry : header.entries) {
    if (entry.begin != expected_begin) violated("entries leave a gap or overlap", entry.name);
    int64_t numel = 1;
    for (const int64_t extent : entry.shape) {
      if (extent < 0) violated("negative extent in an accepted shape", entry.name);
      if (__builtin_mul_overflow(numel, extent, &numel)) violated("an accepted shape overflows int64", entry.name);
    }
    if (entry.end - entry.begin != numel * static_cast<int64_t>(tessera::element_size(entry.dtype)))
      violated("byte range disagrees with the shape", entry.name);
    expected_begin = entry.end;
  }
  if (expected_begin != data_size) violated("entries do not cover the data section", std::to_string(data_size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  int64_t data_size = 0;
  std::memcpy(&data_size, data, 8);  // the fuzzer runs on little-endian machines only
  const std::string_view json_text(reinterpret_cast<const char*>(data) + 8, size - 8);
  tessera::checkpoint::SafetensorsHeader header;
  try {
    header = tessera::checkpoint::parse_safetensors_header(json_text, data_size, kSource);
  } catch (const tessera::Error& error) {
    if (std::string(error.what()).find(kSource) == std::string::npos)
      violated("an error does not name the file", error.what());
    return 0;
  }
  check_invariants(header, data_size);
  return 0;
}
