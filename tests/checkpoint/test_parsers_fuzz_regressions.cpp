// Inputs that broke the checkpoint parsers (found by tests/fuzz/ and while
// writing it): each now gives a tessera::Error that names the file, or parses
// to something valid. A new case per bug; the input is the smallest that showed it.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sealed_json.h"

using namespace tessera;
using namespace tessera::checkpoint;

namespace {

// A metadata.json with one tensor `w` of `dtype` and `global_shape`, its one
// chunk `chunk` (a JSON object's members) and `extra` members at the top.
std::string metadata_text(const std::string& dtype, const std::string& global_shape, const std::string& chunk,
                          const std::string& extra = "") {
  return R"({"format": "tessera-checkpoint", "format_version": 2, )" + extra + R"("tensors": {"w": {"dtype": ")" +
         dtype + R"(", "global_shape": )" + global_shape + R"(, "chunks": [{)" + chunk + "}]}}}";
}

// The parsers check the seal before anything else, so each hand-written case
// is sealed: what is under test is the content.
CheckpointMetadata parse_metadata(const std::string& text) {
  return CheckpointMetadata::parse(seal_json(nlohmann::ordered_json::parse(text)), "ckpt/metadata.json");
}

CheckpointMetadata parse_unsealed_metadata(const std::string& text) {
  return CheckpointMetadata::parse(text, "ckpt/metadata.json");
}

SafetensorsHeader parse_header(const std::string& text, int64_t data_size) {
  return parse_safetensors_header(text, data_size, "model.safetensors");
}

}  // namespace

TEST_CASE("fuzz regression: metadata whose format is not a string") {
  // Threw nlohmann::json::type_error from json.value("format", "").
  CHECK_THROWS_WITH_AS(parse_metadata(R"({"format": 7, "format_version": 2, "tensors": {}})"),
                       doctest::Contains("ckpt/metadata.json: not a tessera checkpoint (format 7)"), Error);
  CHECK_THROWS_WITH_AS(parse_metadata(R"({"format": ["tessera-checkpoint"], "format_version": 2, "tensors": {}})"),
                       doctest::Contains("not a tessera checkpoint"), Error);
}

TEST_CASE("fuzz regression: metadata format_version beyond int") {
  // get<int>() truncated 4294967297 to 1 and accepted a foreign version.
  CHECK_THROWS_WITH_AS(parse_metadata(R"({"format": "tessera-checkpoint", "format_version": 4294967297, "tensors": {}})"),
                       doctest::Contains("format version 4294967297"), Error);
  CHECK_THROWS_WITH_AS(parse_metadata(R"({"format": "tessera-checkpoint", "format_version": -1, "tensors": {}})"),
                       doctest::Contains("format version -1"), Error);
}

TEST_CASE("fuzz regression: metadata shapes whose element count overflows int64") {
  // shape_numel() multiplied 2^48-1 by 2^48-1 (signed overflow, UB) before
  // reaching the zero; such an empty tensor is valid and has 0 elements.
  const std::string big = "281474976710655";
  const CheckpointMetadata empty = parse_metadata(
      metadata_text("F64", "[" + big + ", " + big + ", 0]",
                    R"("file": "a.safetensors", "byte_range": [0, 0], "offsets": [0, 0, 0], "sizes": [)" + big + ", " +
                        big + R"(, 0], "crc32c": [])"));
  CHECK(empty.tensors.at("w").global_shape == Shape{281474976710655, 281474976710655, 0});
  // Without a zero the count is refused before anything multiplies past 2^50.
  CHECK_THROWS_WITH_AS(
      parse_metadata(metadata_text(
          "F32", "[" + big + ", " + big + "]",
          R"("file": "a.safetensors", "byte_range": [0, 4], "offsets": [0, 0], "sizes": [1, 1], "crc32c": [0])")),
      doctest::Contains("ckpt/metadata.json: tensor 'w': shape [281474976710655, 281474976710655] has more than 2^50"),
      Error);
}

TEST_CASE("fuzz regression: metadata nested deep enough to overflow the stack") {
  // Copying training_state recursed once per level: 10^6 '[' crashed.
  const int depth = 1000000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  CHECK_THROWS_WITH_AS(parse_unsealed_metadata(R"({"format": "tessera-checkpoint", "format_version": 2, "tensors": {}, )"
                                               R"("training_state": )" +
                                               nested + "}"),
                       doctest::Contains("ckpt/metadata.json: JSON nested deeper than 64 levels"), Error);
  // Realistic nesting still parses.
  const CheckpointMetadata shallow = parse_metadata(
      R"({"format": "tessera-checkpoint", "format_version": 2, "tensors": {}, "training_state": {"a": [[{"b": [1]}]]}})");
  CHECK(shallow.training_state["a"][0][0]["b"][0] == 1);
}

TEST_CASE("fuzz regression: metadata with an unknown dtype names the file") {
  // The error was "safetensors: unsupported dtype 'U8' ...", with no file or tensor
  // (U8 is a tessera dtype now; I8 is not).
  CHECK_THROWS_WITH_AS(
      parse_metadata(metadata_text(
          "I8", "[1]", R"("file": "a.safetensors", "byte_range": [0, 1], "offsets": [0], "sizes": [1], "crc32c": [0])")),
      doctest::Contains("ckpt/metadata.json: tensor 'w': safetensors: unsupported dtype 'I8'"), Error);
}

TEST_CASE("fuzz regression: metadata chunk files that are not plain names") {
  // "a\u0000b" opened "a" (the NUL ends the path); "." named the directory.
  for (const std::string file : {R"(a\u0000b.safetensors)", ".", "..", "x/y", ""}) {
    CAPTURE(file);
    CHECK_THROWS_WITH_AS(
        parse_metadata(metadata_text("F32", "[1]",
                                     R"("file": ")" + file +
                                         R"(", "byte_range": [0, 4], "offsets": [0], "sizes": [1], "crc32c": [0])")),
        doctest::Contains("is not a plain file name"), Error);
  }
}

TEST_CASE("fuzz regression: safetensors shape entries above INT64_MAX") {
  // 2^64-1 passed is_number_unsigned() and became -1: shape [-1, -1] (1 element) was accepted.
  CHECK_THROWS_WITH_AS(
      parse_header(R"({"a": {"dtype": "F32", "shape": [18446744073709551615, 18446744073709551615], )"
                   R"("data_offsets": [0, 4]}})",
                   4),
      doctest::Contains("model.safetensors: tensor 'a' has a bad shape entry 18446744073709551615"), Error);
  // A 2^60-element shape is refused from the header alone, before anything is allocated.
  CHECK_THROWS_WITH_AS(
      parse_header(R"({"a": {"dtype": "F64", "shape": [1073741824, 1073741824], "data_offsets": [0, 8]}})", 8),
      doctest::Contains("impossibly large shape [1073741824, 1073741824]"), Error);
  // An empty tensor's extents multiply in order, as the reference does: a
  // zero first keeps the count at 0, large extents before it overflow 64 bits
  // and the reference refuses the file (golden/safetensors_cases/shape_*).
  const SafetensorsHeader empty = parse_header(
      R"({"b": {"dtype": "F32", "shape": [0, 1125899906842624, 1125899906842624], "data_offsets": [0, 0]}})", 0);
  CHECK(empty.entries.size() == 1);
  CHECK_THROWS_WITH_AS(
      parse_header(
          R"({"a": {"dtype": "F32", "shape": [1125899906842624, 1125899906842624, 0], "data_offsets": [0, 0]}})", 0),
      doctest::Contains("overflows 64-bit integers when its extents are multiplied in order"), Error);
}

TEST_CASE("fuzz regression: safetensors data offsets above INT64_MAX") {
  // 2^63 became INT64_MIN, passed begin <= end, and end - begin overflowed (UB).
  CHECK_THROWS_WITH_AS(
      parse_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [9223372036854775808, 0]}})", 4),
      doctest::Contains("model.safetensors: tensor 'a' has a bad data offset 9223372036854775808"), Error);
}

TEST_CASE("fuzz regression: safetensors header nested deep enough to overflow the stack") {
  // The error message for a bad shape entry printed it with dump(), which
  // recursed once per level: a header of 10^6 '[' crashed.
  const int depth = 1000000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  CHECK_THROWS_WITH_AS(
      parse_header(R"({"a": {"dtype": "F32", "shape": [)" + nested + R"(], "data_offsets": [0, 4]}})", 4),
      doctest::Contains("model.safetensors: the safetensors header nests deeper than 127 levels"), Error);
}

TEST_CASE("fuzz regression: safetensors unknown dtype names the file") {
  // (F8_E4M3, the dtype first fuzzed here, is a tessera dtype now; F8_E8M0 is not.)
  CHECK_THROWS_WITH_AS(parse_header(R"({"a": {"dtype": "F8_E8M0", "shape": [1], "data_offsets": [0, 1]}})", 1),
                       doctest::Contains("model.safetensors: tensor 'a': safetensors: unsupported dtype 'F8_E8M0'"),
                       Error);
}
