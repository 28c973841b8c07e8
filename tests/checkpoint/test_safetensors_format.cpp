// The .safetensors format as the reference implementation reads it: every file
// of golden/safetensors_cases (written, and judged by the reference, by
// tests/oracle/safetensors_format_cases.py) is accepted or refused here as
// there, refusals naming the file, the bytes and the rule; a short list of
// deliberate differences is asserted as such. Then the float-only rule of
// import_safetensors and checkpoint::load: integers and bools never turn into floats.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "tensor/ops.h"
#include "tests/checkpoint/temp_dir.h"

using namespace tessera;
using namespace tessera::checkpoint;
using tessera::checkpoint::testing::TempDir;

namespace {

const std::string kCasesDir = std::string(TESSERA_CHECKPOINT_GOLDEN_DIR) + "/safetensors_cases";

std::string case_path(const std::string& name) { return kCasesDir + "/" + name + ".safetensors"; }

const nlohmann::json& expectations() {
  static const nlohmann::json parsed = nlohmann::json::parse(std::ifstream(kCasesDir + "/expectations.json"));
  return parsed;
}

// Cases the reference accepts and tessera refuses on purpose, each with what
// its message must say. The format's dtypes that tessera has no type for
// cannot become tensors here; extents over 2^50 (legal in an empty tensor)
// are past the bound that keeps tessera's shape arithmetic in int64.
const std::map<std::string, std::string> kDeliberateDifferences = {
    {"dtype_i8", "tensor 'a': safetensors: unsupported dtype 'I8'"},
    {"dtype_i16", "tensor 'a': safetensors: unsupported dtype 'I16'"},
    {"dtype_u16", "tensor 'a': safetensors: unsupported dtype 'U16'"},
    {"dtype_u32", "tensor 'a': safetensors: unsupported dtype 'U32'"},
    {"dtype_u64", "tensor 'a': safetensors: unsupported dtype 'U64'"},
    {"dtype_f8_e8m0", "tensor 'a': safetensors: unsupported dtype 'F8_E8M0'"},
    {"dtype_f8_e4m3fnuz", "tensor 'a': safetensors: unsupported dtype 'F8_E4M3FNUZ'"},
    {"dtype_f8_e5m2fnuz", "tensor 'a': safetensors: unsupported dtype 'F8_E5M2FNUZ'"},
    {"dtype_c64", "tensor 'a': safetensors: unsupported dtype 'C64'"},
    {"dtype_f4", "tensor 'a': safetensors: unsupported dtype 'F4'"},
    {"dtype_f6_e2m3", "tensor 'a': safetensors: unsupported dtype 'F6_E2M3'"},
    {"dtype_f6_e3m2", "tensor 'a': safetensors: unsupported dtype 'F6_E3M2'"},
    {"shape_u64_max_after_zero", "bad shape entry 18446744073709551615 (header bytes [8, 83)); tessera's extents stop"},
    {"shape_2p60_after_zero", "bad shape entry 1152921504606846976 (header bytes [8, 82)); tessera's extents stop"},
};

// For every case the reference refuses: what tessera's message must say (the
// rule broken, with the bytes where that is specific to the case).
const std::map<std::string, std::string> kRefusals = {
    // the reference's unit tests
    {"ref_json_attack", "data_offsets [0, 16) (file bytes [639, 655)) start inside the tensor before it"},
    {"ref_metadata_incomplete_buffer_extra", "end at byte 16 of the 50-byte data section (which starts at file byte 68)"},
    {"ref_metadata_incomplete_buffer_missing", "run past the 14-byte data section (truncated file?)"},
    {"ref_header_too_large", "over the format's limit of 100000000 bytes"},
    {"ref_header_too_small", "0 bytes is too short for a safetensors file"},
    {"ref_invalid_header_length", "bytes [0, 8) give a header length of 60, but 0 bytes follow them"},
    {"ref_invalid_header_non_utf8", "header bytes [8, 9) are not UTF-8: file byte 8 (0xff)"},
    {"ref_invalid_header_not_json", "header bytes [8, 9) are not JSON"},
    {"ref_invalid_info", "data_offsets [0, 4) (file bytes [68, 72)) hold 4 bytes, but shape [2, 2] of i32 needs 16"},
    {"ref_validation_overflow_elements", "bad shape entry 18446744073709551614"},
    {"ref_validation_overflow_bytes", "bad shape entry 9223372036854775807"},
    // the header's length
    {"file_7_bytes", "7 bytes is too short for a safetensors file"},
    {"file_8_bytes_zero_length", "header bytes [8, 8) are not JSON"},
    {"header_length_at_limit", "header length of 100000000, but 2 bytes follow them"},
    {"header_length_above_limit", "header length of 100000001, over the format's limit of 100000000 bytes"},
    {"header_length_100_mib", "header length of 104857600, over the format's limit"},
    {"header_length_u64_max", "header length of 18446744073709551615, over the format's limit"},
    {"header_length_past_end", "header length of 64, but 54 bytes follow them"},
    // what surrounds the JSON
    {"empty_header_with_data", "end at byte 0 of the 4-byte data section (which starts at file byte 16)"},
    {"leading_bom", "header bytes [8, 65) start with a byte-order mark"},
    {"leading_form_feed", "are not JSON (near file byte 8)"},
    {"leading_nul", "hold a NUL byte at file byte 8"},
    {"trailing_nul_padding", "hold a NUL byte at file byte 10"},
    {"trailing_text", "are not JSON (near file byte 62)"},
    {"trailing_second_object", "are not JSON (near file byte 10)"},
    {"trailing_comma", "are not JSON (near file byte 62)"},
    {"json_comment", "are not JSON (near file byte 8)"},
    {"whitespace_only", "header bytes [8, 16) are not JSON"},
    // the top level
    {"toplevel_array", "header is not a JSON object (header bytes [8, 16) hold array)"},
    {"toplevel_number", "header is not a JSON object (header bytes [8, 16) hold number)"},
    {"toplevel_string", "header is not a JSON object (header bytes [8, 16) hold string)"},
    {"toplevel_null", "header is not a JSON object (header bytes [8, 16) hold null)"},
    // UTF-8 and strings
    {"name_invalid_utf8", "are not UTF-8: file byte 11 (0xff)"},
    {"name_overlong_utf8", "are not UTF-8: file byte 11 (0xc0)"},
    {"name_utf8_surrogate", "are not UTF-8: file byte 11 (0xed)"},
    {"name_truncated_utf8", "are not UTF-8: file byte 11 (0xe2)"},
    {"header_invalid_utf8_in_padding", "are not UTF-8: file byte 62 (0xff)"},
    {"name_lone_surrogate_escape", "are not JSON (near file byte 17)"},
    {"name_raw_control_char", "are not JSON (near file byte 11)"},
    // __metadata__
    {"metadata_int_value", "__metadata__ value 'n' is number, not a string"},
    {"metadata_null_value", "__metadata__ value 'n' is null, not a string"},
    {"metadata_nested", "__metadata__ value 'n' is object, not a string"},
    {"metadata_array_value", "__metadata__ value 'n' is array, not a string"},
    {"metadata_is_array", "__metadata__ is array (header bytes [8, 80)); it must be an object of strings, or null"},
    {"metadata_is_string", "__metadata__ is string (header bytes [8, 81))"},
    {"metadata_duplicate", "the header has \"__metadata__\" twice (header bytes [8, 98))"},
    {"metadata_duplicate_key_first_not_string", "__metadata__ value 'k' is number, not a string"},
    // dtypes
    {"dtype_f4_odd_bits", "tensor 'a': safetensors: unsupported dtype 'F4'"},
    {"dtype_unknown", "tensor 'a' has dtype 'X', which is not a safetensors dtype (header bytes [8, 64))"},
    {"dtype_lowercase", "tensor 'a' has dtype 'f32', which is not a safetensors dtype"},
    {"dtype_c128", "tensor 'a' has dtype 'C128', which is not a safetensors dtype"},
    {"dtype_empty", "tensor 'a' has dtype '', which is not a safetensors dtype"},
    {"dtype_number", "tensor 'a' has dtype 4 (header bytes [8, 58)); a dtype is a name"},
    {"dtype_null", "tensor 'a' has dtype null"},
    {"dtype_map_form_value", "tensor 'a' has dtype {\"F32\":1}"},
    {"dtype_map_form_two_keys", "tensor 'a' has dtype {\"F32\":null,\"F64\":null}"},
    {"dtype_map_form_key_twice", "tensor 'a' has dtype {\"F32\":null} (header bytes [8, 80))"},
    {"dtype_map_form_empty", "tensor 'a' has dtype {}"},
    {"dtype_map_form_unknown", "tensor 'a' has dtype 'X', which is not a safetensors dtype"},
    {"dtype_array", "tensor 'a' has dtype [\"F32\"]"},
    // a tensor entry's fields
    {"entry_duplicate_dtype", "tensor 'a' has \"dtype\" twice (header bytes [8, 76))"},
    {"entry_duplicate_data_offsets", "tensor 'a' has \"data_offsets\" twice"},
    {"entry_missing_dtype", "tensor 'a' has no \"dtype\""},
    {"entry_missing_shape", "tensor 'a' has no \"shape\""},
    {"entry_missing_data_offsets", "tensor 'a' has no \"data_offsets\""},
    {"entry_empty_object", "tensor 'a' has no \"dtype\" (header bytes [8, 16))"},
    {"entry_string", "tensor 'a' is string (header bytes [8, 19)); an entry is"},
    {"entry_null", "tensor 'a' is null"},
    {"entry_number", "tensor 'a' is number"},
    {"entry_array_form_short", "tensor 'a' is an array of 2 values"},
    {"entry_array_form_long", "tensor 'a' is an array of 4 values"},
    {"extra_number_out_of_range", "are not JSON (near file byte 69)"},
    {"extra_bad_escape", "are not JSON (near file byte 67)"},
    // data_offsets
    {"offsets_one_entry", "tensor 'a' has data_offsets [4] (header bytes [8, 60)); they must be [begin, end]"},
    {"offsets_three_entries", "tensor 'a' has data_offsets [0,4,4]"},
    {"offsets_empty", "tensor 'a' has data_offsets []"},
    {"offsets_null", "tensor 'a' has data_offsets null"},
    {"offsets_object", "tensor 'a' has data_offsets {\"0\":0,\"1\":4}"},
    {"offsets_negative", "tensor 'a' has a bad data offset -4 (header bytes [8, 63)); offsets are integers from 0"},
    {"offsets_negative_zero", "tensor 'a' has a bad data offset -0"},
    {"offsets_float", "tensor 'a' has a bad data offset 4.0"},
    {"offsets_exponent", "tensor 'a' has a bad data offset 4.0"},
    {"offsets_string", "tensor 'a' has a bad data offset \"0\""},
    {"offsets_above_u64", "tensor 'a' has a bad data offset 1.8446744073709552e+19"},
    {"offsets_u64_max", "tensor 'a' has a bad data offset 18446744073709551615"},
    {"offsets_past_data", "data_offsets [0, 8) (file bytes [62, 70)) hold 8 bytes, but shape [1] of f32 needs 4"},
    {"offsets_end_before_begin", "tensor 'b': data_offsets [4, 0) (file bytes [119, 115)) end before they begin"},
    {"offsets_leading_zero", "are not JSON (near file byte 57)"},
    // shapes
    {"shape_negative", "tensor 'a' has a bad shape entry -1 (header bytes [8, 63)); extents are integers from 0"},
    {"shape_negative_zero", "tensor 'a' has a bad shape entry -0"},
    {"shape_float", "tensor 'a' has a bad shape entry 1.0"},
    {"shape_string", "tensor 'a' has a bad shape entry \"1\""},
    {"shape_nested", "tensor 'a' has a bad shape entry [1]"},
    {"shape_above_u64", "tensor 'a' has a bad shape entry 1.8446744073709552e+19"},
    {"shape_not_array", "tensor 'a' has a shape that is number"},
    {"shape_object", "tensor 'a' has a shape that is object"},
    {"shape_null", "tensor 'a' has a shape that is null"},
    {"shape_huge_elements", "impossibly large shape [1073741824, 1073741824] (over 2^50 elements) (header bytes [8, 82))"},
    {"shape_2p50_2p50_then_zero", "overflows 64-bit integers when its extents are multiplied in order"},
    {"shape_2p32_2p32_then_zero", "overflows 64-bit integers when its extents are multiplied in order"},
    {"shape_bytes_mismatch", "data_offsets [0, 4) (file bytes [62, 66)) hold 4 bytes, but shape [2] of f32 needs 8"},
    // tiling
    {"tile_gap", "tensor 'b': data_offsets [8, 12) (file bytes [128, 132)) leave bytes [4, 8) of the data section "
                 "unused: the tensors must tile the data section with no gap"},
    {"tile_overlap", "tensor 'b': data_offsets [4, 8) (file bytes [124, 128)) start inside the tensor before it, "
                     "which ends at 8: the tensors must tile the data section with no overlap"},
    {"tile_same_range", "tensor 'b': data_offsets [0, 4) (file bytes [120, 124)) start inside the tensor before it"},
    {"tile_not_from_zero", "tensor 'a': data_offsets [4, 8) (file bytes [68, 72)) leave bytes [0, 4)"},
    {"tile_short_of_end", "end at byte 4 of the 8-byte data section (which starts at file byte 64): the last tensor"},
    {"tile_zero_sized_past_end", "tensor 'z': data_offsets [8, 8) (file bytes [128, 128)) leave bytes [4, 8)"},
    // names given twice
    {"duplicate_name_first_not_entry", "tensor 'a' is string (header bytes [8, 70))"},
    {"duplicate_name_first_unknown_dtype", "tensor 'a' has dtype 'X', which is not a safetensors dtype"},
    // nesting
    {"nested_128", "nests deeper than 127 levels (the reference parser's limit) (header bytes [8, 319))"},
    {"nested_in_shape", "nests deeper than 127 levels"},
    {"nested_toplevel", "nests deeper than 127 levels"},
};

// What read_safetensors_header throws for the file at `path`, or "" when it accepts it.
std::string refusal(const std::string& path) {
  try {
    read_safetensors_header(path);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

std::string hex_bytes(const Tensor& tensor) {
  std::string hex;
  const auto* bytes = static_cast<const uint8_t*>(tensor.raw_data());
  for (int64_t i = 0; i < tensor.nbytes(); ++i) hex += fmt::format("{:02x}", bytes[i]);
  return hex;
}

// What `load` throws, or "" when it returns.
template <typename Load>
std::string error_of(Load&& load) {
  try {
    load();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool bytes_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && hex_bytes(ops::clone(a.detach())) == hex_bytes(ops::clone(b.detach()));
}

}  // namespace

TEST_CASE("safetensors format: the golden cases were judged by the reference implementation") {
  CHECK(expectations()["reference"].get<std::string>().starts_with("safetensors 0.8.0"));
  // Every refused case has its rule here and nothing here is stale, so a new
  // golden case cannot pass unexamined.
  for (const auto& [name, expected] : expectations()["cases"].items()) {
    CAPTURE(name);
    const bool accepted = expected["accepted"].get<bool>();
    if (kDeliberateDifferences.count(name) == 1) {
      CHECK(accepted);
    } else {
      CHECK(kRefusals.count(name) == (accepted ? 0 : 1));
    }
  }
  for (const auto* table : {&kRefusals, &kDeliberateDifferences}) {
    for (const auto& [name, rule] : *table) {
      CAPTURE(name);
      CHECK(expectations()["cases"].contains(name));
    }
  }
}

TEST_CASE("safetensors format: what the reference refuses is refused, naming the file, the bytes and the rule") {
  for (const auto& [name, rule] : kRefusals) {
    CAPTURE(name);
    REQUIRE(expectations()["cases"].contains(name));
    CHECK_FALSE(expectations()["cases"][name]["accepted"].get<bool>());
    const std::string path = case_path(name);
    const std::string message = refusal(path);
    CAPTURE(message);
    REQUIRE(!message.empty());
    CHECK(message.starts_with(path + ": "));
    CHECK(message.find("byte") != std::string::npos);
    CHECK(message.find(rule) != std::string::npos);
  }
}

TEST_CASE("safetensors format: deliberate differences, accepted by the reference and refused here by name") {
  for (const auto& [name, rule] : kDeliberateDifferences) {
    CAPTURE(name);
    REQUIRE(expectations()["cases"].contains(name));
    CHECK(expectations()["cases"][name]["accepted"].get<bool>());
    const std::string message = refusal(case_path(name));
    CAPTURE(message);
    CHECK(message.starts_with(case_path(name) + ": "));
    CHECK(message.find(rule) != std::string::npos);
  }
}

TEST_CASE("safetensors format: what the reference accepts reads the same names, dtypes, shapes, bytes and metadata") {
  int accepted = 0;
  for (const auto& [name, expected] : expectations()["cases"].items()) {
    if (!expected["accepted"].get<bool>() || kDeliberateDifferences.count(name) == 1) continue;
    CAPTURE(name);
    ++accepted;
    const std::string path = case_path(name);
    CHECK(refusal(path) == "");
    const SafetensorsHeader header = read_safetensors_header(path);
    std::map<std::string, std::string> metadata;
    if (!expected["metadata"].is_null()) metadata = expected["metadata"].get<std::map<std::string, std::string>>();
    CHECK(header.metadata == metadata);
    REQUIRE(header.entries.size() == expected["tensors"].size());
    for (const nlohmann::json& tensor : expected["tensors"]) {
      const std::string tensor_name = tensor["name"].get<std::string>();
      CAPTURE(tensor_name);
      const SafetensorsEntry& entry = header.entry(tensor_name, path);
      CHECK(entry.dtype == dtype_from_safetensors(tensor["dtype"].get<std::string>()));
      CHECK(entry.shape == tensor["shape"].get<Shape>());
      // Empty tensors have no bytes to compare (and some have extents no buffer could hold).
      if (entry.end > entry.begin) CHECK(hex_bytes(read_safetensors_tensor(path, tensor_name)) == tensor["data"]);
    }
  }
  CHECK(accepted == 49);  // of 63 the reference accepts; the other 14 are the deliberate differences
}

TEST_CASE("safetensors format: the reference's own unit tests, one by one") {
  // tensor.rs test_empty_shapes_allowed, test_deserialization, test_zero_sized_tensor
  CHECK(read_safetensors_header(case_path("ref_empty_shapes_allowed")).entry("test", "").shape == Shape{});
  const SafetensorsHeader deserialized = read_safetensors_header(case_path("ref_deserialization"));
  CHECK(deserialized.entry("test", "").dtype == DType::i32);
  CHECK(deserialized.entry("test", "").shape == Shape{2, 2});
  CHECK(deserialized.data_offset == 68);
  CHECK(read_safetensors_header(case_path("ref_zero_sized_tensor")).entry("test", "").shape == Shape{2, 0});
  // test_whitespace_padded_header, and the start-padded case the reference keeps accepting
  CHECK(read_safetensors_header(case_path("ref_whitespace_padded_header")).entries.empty());
  CHECK(read_safetensors_header(case_path("ref_whitespace_start_padded_header")).entries.empty());
  // The refusals (test_json_attack, test_metadata_incomplete_buffer, test_header_too_large, ...) are in kRefusals.
  for (const char* name : {"ref_json_attack", "ref_metadata_incomplete_buffer_extra",
                           "ref_metadata_incomplete_buffer_missing", "ref_header_too_large", "ref_header_too_small",
                           "ref_invalid_header_length", "ref_invalid_header_non_utf8", "ref_invalid_header_not_json",
                           "ref_invalid_info", "ref_validation_overflow_elements", "ref_validation_overflow_bytes"}) {
    CAPTURE(name);
    CHECK(kRefusals.count(name) == 1);
  }
}

TEST_CASE("safetensors format: a name given twice is the last entry, each one checked") {
  CHECK(read_safetensors_header(case_path("duplicate_name_last_wins")).entry("a", "").shape == Shape{2});
  // The first "a" is a U8 entry; the last replaces it.
  CHECK(read_safetensors_header(case_path("duplicate_name_first_u8")).entry("a", "").dtype == DType::f32);
  CHECK(read_safetensors_header(case_path("metadata_duplicate_key")).metadata.at("k") == "2");
}

// ---- only a float loads into a float ---------------------------------------------------------------

TEST_CASE("import_safetensors: integer and bool tensors are refused by float parameters before anything is read") {
  TempDir tmp;
  for (const DType stored : {DType::i32, DType::i64, DType::boolean}) {
    CAPTURE(dtype_name(stored));
    const std::string path = tmp / fmt::format("{}.safetensors", dtype_name(stored));
    // "a" comes before "w" in name order: it would be read first if the check came late.
    write_safetensors(path, {{"a", ops::from_vector(std::vector<float>{1, 2, 3}, {3})},
                             {"w", ops::to(ops::from_vector(std::vector<float>{1, 0, 1, 1}, {4}), stored)}});
    const Tensor a = ops::full({3}, 7.0, {.requires_grad = true});
    const Tensor w = ops::full({4}, 5.0, {.requires_grad = true});
    const Tensor a_before = ops::clone(a.detach()), w_before = ops::clone(w.detach());
    const std::string message = error_of([&] { import_safetensors(path, {{"a", a}, {"w", w}}); });
    CAPTURE(message);
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find(fmt::format("w: dtype {} in the file, f32 here", safetensors_dtype(stored))) !=
          std::string::npos);
    CHECK(bytes_equal(a, a_before));
    CHECK(bytes_equal(w, w_before));
  }
}

TEST_CASE("import_safetensors: an integer tensor loads only into its own dtype, a float never into an integer") {
  TempDir tmp;
  const std::string path = tmp / "ints.safetensors";
  write_safetensors(path, {{"i", ops::from_vector(std::vector<int64_t>{4, -5, 6}, {3}, {.dtype = DType::i32})},
                           {"f", ops::from_vector(std::vector<float>{0.5f, 1.5f}, {2})}});
  for (const auto& [i_dtype, f_dtype, mismatch] :
       {std::tuple{DType::i64, DType::f32, "i: dtype I32 in the file, i64 here"},
        std::tuple{DType::boolean, DType::f32, "i: dtype I32 in the file, bool here"},
        std::tuple{DType::i32, DType::i32, "f: dtype F32 in the file, i32 here"}}) {
    CAPTURE(mismatch);
    const DistributedStateDict state{{"i", ops::zeros({3}, {.dtype = i_dtype})}, {"f", ops::zeros({2}, {.dtype = f_dtype})}};
    CHECK(error_of([&] { import_safetensors(path, state); }).find(mismatch) != std::string::npos);
  }
  const DistributedStateDict same{{"i", ops::zeros({3}, {.dtype = DType::i32})}, {"f", ops::zeros({2})}};
  import_safetensors(path, same);
  CHECK(std::get<Tensor>(same.at("i")).to_vector<double>() == std::vector<double>{4, -5, 6});
}

TEST_CASE("import_safetensors: F16, BF16 and F64 tensors still convert into f32, and F32 into bf16") {
  TempDir tmp;
  const std::string path = tmp / "floats.safetensors";
  const Tensor source = ops::from_vector(std::vector<double>{0.5, -1.25, 3.0 + 1.0 / 3.0}, {3}, {.dtype = DType::f64});
  write_safetensors(path, {{"h", ops::to(source, DType::f16)},
                           {"b", ops::to(source, DType::bf16)},
                           {"d", source},
                           {"s", ops::to(source, DType::f32)}});
  const DistributedStateDict state{{"h", ops::zeros({3})}, {"b", ops::zeros({3})}, {"d", ops::zeros({3})},
                                   {"s", ops::zeros({3}, {.dtype = DType::bf16})}};
  import_safetensors(path, state);
  CHECK(bytes_equal(std::get<Tensor>(state.at("h")), ops::to(ops::to(source, DType::f16), DType::f32)));
  CHECK(bytes_equal(std::get<Tensor>(state.at("b")), ops::to(ops::to(source, DType::bf16), DType::f32)));
  CHECK(bytes_equal(std::get<Tensor>(state.at("d")), ops::to(source, DType::f32)));
  CHECK(bytes_equal(std::get<Tensor>(state.at("s")), ops::to(ops::to(source, DType::f32), DType::bf16)));
}

TEST_CASE("checkpoint::load: an integer tensor is refused by a float one before anything is read; floats convert") {
  TempDir tmp;
  const std::string dir = tmp / "ckpt";
  save(dir, {{"a", ops::from_vector(std::vector<float>{1, 2, 3}, {3})},
             {"w", ops::from_vector(std::vector<int64_t>{7, 8}, {2}, {.dtype = DType::i32})}});
  const Tensor a = ops::full({3}, 9.0), w = ops::full({2}, 5.0);
  const Tensor a_before = ops::clone(a), w_before = ops::clone(w);
  const std::string message = error_of([&] { load(dir, {{"a", a}, {"w", w}}); });
  CAPTURE(message);
  CHECK(message.find(dir) != std::string::npos);
  CHECK(message.find("w: dtype i32 in the checkpoint, f32 here") != std::string::npos);
  CHECK(bytes_equal(a, a_before));
  CHECK(bytes_equal(w, w_before));

  const DistributedStateDict converted{{"a", ops::zeros({3}, {.dtype = DType::bf16})},
                                       {"w", ops::zeros({2}, {.dtype = DType::i32})}};
  load(dir, converted);
  CHECK(std::get<Tensor>(converted.at("a")).to_vector<double>() == std::vector<double>{1, 2, 3});
  CHECK(std::get<Tensor>(converted.at("w")).to_vector<double>() == std::vector<double>{7, 8});
}
