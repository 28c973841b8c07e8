// libFuzzer target for CheckpointMetadata::parse, the reader of a checkpoint's
// metadata.json. Any input may be rejected, but only with a tessera::Error that
// names the file; anything else (another exception type, a crash, UB, a huge
// allocation) aborts and libFuzzer saves the input. An accepted input must
// describe a valid checkpoint and survive a round trip through to_json_text().
// The file is sealed (a CRC-32C of its bytes), so nearly every mutation fails
// the seal: each input is parsed as it is (the seal check) and, when it is a
// JSON object without a seal, sealed first (the content checks behind it).
// Built and run by tests/fuzz/run_fuzzers.sh.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/metadata.h"
#include "checkpoint/sealed_json.h"

namespace {

constexpr const char* kSource = "fuzz/metadata.json";

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_metadata: %s: %s\n", what, detail.c_str());
  std::abort();
}

// The product of the extents, which must fit int64 (a zero extent makes it 0
// whatever the others are).
int64_t element_count(const tessera::Shape& shape, const std::string& name) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t count = 1;
  for (const int64_t extent : shape) {
    if (__builtin_mul_overflow(count, extent, &count)) violated("an accepted shape overflows int64", name);
  }
  return count;
}

// What parse() promises about everything it accepts.
void check_invariants(const tessera::checkpoint::CheckpointMetadata& metadata) {
  using tessera::checkpoint::kChecksumBlock;
  for (const auto& [name, info] : metadata.tensors) {
    int64_t covered = 0;
    for (const auto& chunk : info.chunks) {
      if (chunk.offsets.size() != info.global_shape.size() || chunk.sizes.size() != info.global_shape.size())
        violated("chunk rank differs from the tensor's", name);
      for (size_t d = 0; d < info.global_shape.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] + chunk.sizes[d] > info.global_shape[d])
          violated("chunk outside the tensor", name);
      }
      const int64_t numel = element_count(chunk.sizes, name);
      const int64_t bytes = chunk.byte_end - chunk.byte_begin;
      if (chunk.byte_begin < 0 || bytes != numel * static_cast<int64_t>(tessera::element_size(info.dtype)))
        violated("byte range disagrees with the chunk's sizes", name);
      if (static_cast<int64_t>(chunk.crc32c.size()) != (bytes + kChecksumBlock - 1) / kChecksumBlock)
        violated("wrong number of checksums", name);
      covered += numel;
    }
    if (covered != element_count(info.global_shape, name)) violated("chunks do not cover the tensor", name);
  }
}

// `text` sealed, when it is a JSON object without a seal (nested at most as
// deep as the parser accepts, so that the copy here cannot overflow the stack).
std::string sealed(const std::string& text) {
  const auto limit_depth = [](int depth, nlohmann::ordered_json::parse_event_t, nlohmann::ordered_json&) {
    return depth < 64;
  };
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(text, limit_depth, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || json.contains("crc32c")) return {};
  return tessera::checkpoint::seal_json(json);
}

void parse_and_check(const std::string& text) {
  using tessera::checkpoint::CheckpointMetadata;
  CheckpointMetadata metadata;
  try {
    metadata = CheckpointMetadata::parse(text, kSource);
  } catch (const tessera::Error& error) {
    if (std::string(error.what()).find(kSource) == std::string::npos)
      violated("an error does not name the file", error.what());
    return;
  }
  check_invariants(metadata);
  // What was accepted is written back as metadata that parses to the same thing.
  const std::string written = metadata.to_json_text();
  CheckpointMetadata reparsed;
  try {
    reparsed = CheckpointMetadata::parse(written, kSource);
  } catch (const tessera::Error& error) {
    violated("to_json_text() wrote metadata that parse() rejects", error.what());
  }
  if (reparsed.to_json_text() != written) violated("the round trip changed the metadata", written);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parse_and_check(text);
  const std::string with_seal = sealed(text);
  if (!with_seal.empty()) parse_and_check(with_seal);
  return 0;
}
