#!/usr/bin/env python3
"""The .safetensors format's rules, as the reference implementation (Hugging
Face's `safetensors`, Rust core) applies them, written down as small files.

  python3 tests/oracle/safetensors_format_cases.py [OUT_DIR]
      Builds every case below as OUT_DIR/<case>.safetensors (default
      tests/checkpoint/golden/safetensors_cases), asks the installed reference
      whether it loads each one, and writes OUT_DIR/expectations.json: per case
      whether the reference accepts it, its error text, and for accepted files
      every tensor's name, dtype, shape and bytes (hex) and the metadata.

The reference's full load path is safetensors.deserialize(bytes): the header
checks of SafeTensors::deserialize plus every tensor's bytes handed out.
safe_open(path, framework="numpy") opens the same files through the same
header checks; the script asserts the two agree. The cases are the reference's
own unit tests (safetensors/src/tensor.rs, mod tests: bytes written anew here)
plus the edges of each rule. tests/checkpoint/test_safetensors_format.cpp holds
tessera's reader to these verdicts without Python.

The golden files were made with safetensors 0.8.0 (numpy 2.4.6):
  pip install safetensors==0.8.0 numpy
  python3 tests/oracle/safetensors_format_cases.py
"""
import json
import os
import struct
import sys

import numpy as np
import safetensors

DEFAULT_OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint", "golden",
                                            "safetensors_cases"))


def length(n):
    """The 8-byte little-endian header length."""
    return struct.pack("<Q", n)


def st(header, data=b"", pad=False):
    """A file: the header's length, the header (str or bytes), the data."""
    text = header.encode() if isinstance(header, str) else header
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return length(len(text)) + text + data


def entry(dtype, shape, begin, end):
    return '{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' % (dtype, json.dumps(shape).replace(" ", ""), begin, end)


def one(dtype, shape, nbytes, data=None, name="a"):
    """A file holding one tensor `name` at [0, nbytes) of the data."""
    return st('{"%s":%s}' % (name, entry(dtype, shape, 0, nbytes)), payload(nbytes) if data is None else data, pad=True)


def payload(nbytes, seed=0):
    """Distinct, deterministic bytes (values of any dtype but BOOL)."""
    return bytes((i * 37 + 11 + seed) % 256 for i in range(nbytes))


def nested(levels):
    return "[" * levels + "]" * levels


F32_4 = entry("F32", [1], 0, 4)  # the common one-element tensor


def cases():
    """(name, bytes, what it checks) for every case, in a stable order."""
    c = []

    def add(name, data, what):
        c.append((name, data, what))

    # ---- the reference's own unit tests (tensor.rs, mod tests) -------------------------------------
    test_json = '{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}'
    add("ref_empty_shapes_allowed", st('{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', b"\0" * 4),
        "test_empty_shapes_allowed: a 0-d I32 tensor")
    add("ref_deserialization", st(test_json, b"\0" * 16), "test_deserialization: one I32 [2, 2] tensor")
    attack = "{" + ",".join('"weight_%d":%s' % (i, entry("F32", [2, 2], 0, 16)) for i in range(10)) + "}"
    add("ref_json_attack", st(attack, b"\0" * 16), "test_json_attack: ten tensors claiming the same 16 bytes")
    add("ref_metadata_incomplete_buffer_extra", st(test_json, b"\0" * 16 + b"extra_bogus_data_for_polyglot_file"),
        "test_metadata_incomplete_buffer: bytes after the last tensor")
    add("ref_metadata_incomplete_buffer_missing", st(test_json, b"\0" * 14),
        "test_metadata_incomplete_buffer: the data is 2 bytes short")
    add("ref_header_too_large", b"<\x00\x00\x00\x00\xff\xff\xff" + test_json.encode() + b"\0" * 16,
        "test_header_too_large: a length of 0xffffff000000003c")
    add("ref_header_too_small", b"", "test_header_too_small: an empty file")
    add("ref_invalid_header_length", length(60), "test_invalid_header_length: a length and nothing after it")
    add("ref_invalid_header_non_utf8", length(1) + b"\xff", "test_invalid_header_non_utf8")
    add("ref_invalid_header_not_json", length(1) + b"{", "test_invalid_header_not_json")
    add("ref_whitespace_padded_header", length(6) + b"{}\x0d\x20\x09\x0a",
        "test_whitespace_padded_header: JSON whitespace after the object")
    add("ref_whitespace_start_padded_header", length(6) + b"\x09\x0a{}\x0d\x20",
        "the reserved test_whitespace_start_padded_header: JSON whitespace before the object")
    add("ref_zero_sized_tensor", length(60) + b'{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}',
        "test_zero_sized_tensor: an I32 [2, 0] tensor and no data")
    add("ref_invalid_info", length(60) + b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}',
        "test_invalid_info: 4 bytes for 16 bytes of shape")
    add("ref_validation_overflow_elements",
        st('{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}', b"\0" * 16),
        "test_validation_overflow: the element count overflows 64 bits")
    add("ref_validation_overflow_bytes",
        st('{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}', b"\0" * 16),
        "test_validation_overflow: elements times 4 bytes overflows 64 bits")

    # ---- the header's length ----------------------------------------------------------------------
    add("file_7_bytes", b"\x02\0\0\0\0\0\0", "shorter than the length field")
    add("file_8_bytes_zero_length", length(0), "exactly 8 bytes: a length of 0 and no JSON")
    add("header_length_at_limit", length(100_000_000) + b"{}", "a length of exactly 100,000,000 in a short file")
    add("header_length_above_limit", length(100_000_001) + b"{}", "a length of 100,000,001: over the format's limit")
    add("header_length_100_mib", length(100 << 20) + b"{}", "a length of 100 MiB, above the decimal limit")
    add("header_length_u64_max", length(2**64 - 1) + b"{}", "a length of 2^64-1")
    add("header_length_past_end", length(64) + b'{"a":' + F32_4.encode() + b"}", "the length runs past the file")

    # ---- what surrounds the JSON ------------------------------------------------------------------
    add("empty_header", st("{}", pad=True), "an empty header, no data (what the reference writes for no tensors)")
    add("empty_header_with_data", st("{}", b"\0" * 4, pad=True), "an empty header with 4 bytes of data")
    add("empty_header_unpadded", st("{}"), "'{}' with no padding: padding is not required")
    add("unpadded_header", st('{"a":%s}' % F32_4, payload(4)), "a header whose length is not a multiple of 8")
    add("leading_whitespace", st(' \t\r\n{"a":%s}' % F32_4, payload(4)), "JSON whitespace before '{'")
    add("leading_bom", st(b'\xef\xbb\xbf{"a":' + F32_4.encode() + b"}", payload(4)), "a UTF-8 byte-order mark")
    add("leading_form_feed", st('\x0c{"a":%s}' % F32_4, payload(4)), "a form feed (not JSON whitespace) before '{'")
    add("trailing_nul_padding", st(b"{}" + b"\0" * 6), "NUL padding after the JSON")
    add("leading_nul", st(b"\0{}"), "a NUL byte before the JSON")
    add("trailing_text", st('{"a":%s}x' % F32_4, payload(4)), "a non-whitespace byte after the JSON")
    add("trailing_second_object", st("{}{}"), "a second JSON value after the first")
    add("trailing_comma", st('{"a":%s,}' % F32_4, payload(4)), "a trailing comma in the object")
    add("json_comment", st('/**/{"a":%s}' % F32_4, payload(4)), "a comment before the object")
    add("whitespace_only", st(" " * 8), "a header of spaces only")

    # ---- the top level ----------------------------------------------------------------------------
    add("toplevel_array", st("[]", pad=True), "the header is an array")
    add("toplevel_number", st("1", pad=True), "the header is a number")
    add("toplevel_string", st('"a"', pad=True), "the header is a string")
    add("toplevel_null", st("null", pad=True), "the header is null")

    # ---- UTF-8 and strings ------------------------------------------------------------------------
    add("name_invalid_utf8", st(b'{"a\xff":' + F32_4.encode() + b"}", payload(4)), "a 0xff byte inside a name")
    add("name_overlong_utf8", st(b'{"a\xc0\xaf":' + F32_4.encode() + b"}", payload(4)), "an overlong encoding")
    add("name_utf8_surrogate", st(b'{"a\xed\xa0\x80":' + F32_4.encode() + b"}", payload(4)),
        "a UTF-16 surrogate encoded in UTF-8")
    add("name_truncated_utf8", st(b'{"a\xe2\x82":' + F32_4.encode() + b"}", payload(4)), "a cut multi-byte sequence")
    add("name_lone_surrogate_escape", st('{"a\\ud800":%s}' % F32_4, payload(4)), "a lone surrogate \\u escape")
    add("name_raw_control_char", st('{"a\tb":%s}' % F32_4, payload(4)), "a raw tab inside a name")
    add("name_escaped_nul", st('{"a\\u0000b":%s}' % F32_4, payload(4)), "an escaped NUL inside a name")
    add("name_unicode", st('{"poids_\u00e9\u6743":%s}' % F32_4, payload(4)), "a name with non-ASCII UTF-8")
    add("name_empty", st('{"":%s}' % F32_4, payload(4)), "the empty name")
    add("header_invalid_utf8_in_padding", st(b'{"a":' + F32_4.encode() + b"}\xff", payload(4)),
        "a 0xff byte after the JSON")

    # ---- __metadata__ -----------------------------------------------------------------------------
    add("metadata_strings", st('{"__metadata__":{"format":"pt","note":""},"a":%s}' % F32_4, payload(4), pad=True),
        "string to string metadata")
    add("metadata_empty", st('{"__metadata__":{},"a":%s}' % F32_4, payload(4)), "an empty metadata object")
    add("metadata_null", st('{"__metadata__":null,"a":%s}' % F32_4, payload(4)), "metadata null (no metadata)")
    add("metadata_int_value", st('{"__metadata__":{"n":1},"a":%s}' % F32_4, payload(4)), "a number value")
    add("metadata_null_value", st('{"__metadata__":{"n":null},"a":%s}' % F32_4, payload(4)), "a null value")
    add("metadata_nested", st('{"__metadata__":{"n":{"m":"x"}},"a":%s}' % F32_4, payload(4)), "an object value")
    add("metadata_array_value", st('{"__metadata__":{"n":["x"]},"a":%s}' % F32_4, payload(4)), "an array value")
    add("metadata_is_array", st('{"__metadata__":[],"a":%s}' % F32_4, payload(4)), "metadata is an array")
    add("metadata_is_string", st('{"__metadata__":"x","a":%s}' % F32_4, payload(4)), "metadata is a string")
    add("metadata_duplicate", st('{"__metadata__":{},"__metadata__":{},"a":%s}' % F32_4, payload(4)),
        "__metadata__ twice")
    add("metadata_duplicate_key", st('{"__metadata__":{"k":"1","k":"2"},"a":%s}' % F32_4, payload(4)),
        "a metadata key twice: the last wins")
    add("metadata_duplicate_key_first_not_string",
        st('{"__metadata__":{"k":1,"k":"2"},"a":%s}' % F32_4, payload(4)),
        "a metadata key twice, the first not a string")

    # ---- dtypes -----------------------------------------------------------------------------------
    add("dtype_bool", one("BOOL", [3], 3, bytes([1, 0, 1])), "BOOL")
    add("dtype_i32", one("I32", [2], 8), "I32")
    add("dtype_i64", one("I64", [2], 16), "I64")
    add("dtype_f16", one("F16", [3], 6), "F16")
    add("dtype_bf16", one("BF16", [3], 6), "BF16")
    add("dtype_f32", one("F32", [2, 2], 16), "F32")
    add("dtype_f64", one("F64", [2], 16), "F64")
    # The format's dtypes that tessera has no type for: (name, shape, bytes).
    for name, shape, nbytes in [("U8", [2], 2), ("I8", [2], 2), ("I16", [2], 4), ("U16", [2], 4), ("U32", [2], 8),
                                ("U64", [1], 8), ("F8_E5M2", [2], 2), ("F8_E4M3", [2], 2), ("F8_E8M0", [2], 2),
                                ("F8_E4M3FNUZ", [2], 2), ("F8_E5M2FNUZ", [2], 2), ("C64", [1], 8), ("F4", [2], 1),
                                ("F6_E2M3", [4], 3), ("F6_E3M2", [4], 3)]:
        add("dtype_" + name.lower(), one(name, shape, nbytes), name + ": a format dtype tessera lacks")
    add("dtype_f4_odd_bits", one("F4", [3], 2), "F4 x 3: 12 bits, not whole bytes")
    add("dtype_unknown", one("X", [1], 4), "a dtype name the format does not have")
    add("dtype_lowercase", one("f32", [1], 4), "a lower-case dtype name")
    add("dtype_c128", one("C128", [1], 16), "C128: not a format dtype")
    add("dtype_empty", one("", [1], 4), "the empty dtype name")
    add("dtype_number", st('{"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}', payload(4)), "a number for dtype")
    add("dtype_null", st('{"a":{"dtype":null,"shape":[1],"data_offsets":[0,4]}}', payload(4)), "null for dtype")

    # serde reads an enum from a one-key map too: {"F32": null} is F32.
    def dtype_map(text):
        return st('{"a":{"dtype":%s,"shape":[1],"data_offsets":[0,4]}}' % text, payload(4))

    add("dtype_map_form", dtype_map('{"F32":null}'), 'dtype as the map {"F32": null}')
    add("dtype_map_form_value", dtype_map('{"F32":1}'), 'dtype as {"F32": 1}: the value must be null')
    add("dtype_map_form_two_keys", dtype_map('{"F32":null,"F64":null}'), "dtype as a map of two keys")
    add("dtype_map_form_key_twice", dtype_map('{"F32":null,"F32":null}'), "dtype as a map with one key twice")
    add("dtype_map_form_empty", dtype_map("{}"), "dtype as an empty map")
    add("dtype_map_form_unknown", dtype_map('{"X":null}'), "dtype as a map of an unknown name")
    add("dtype_array", dtype_map('["F32"]'), "dtype as an array")

    # ---- a tensor entry's fields ------------------------------------------------------------------
    add("entry_extra_field", st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"note":{"x":[1,"y"]}}}',
                                payload(4)), "an extra field in a tensor entry")
    add("entry_fields_reordered", st('{"a":{"data_offsets":[0,4],"shape":[1],"dtype":"F32"}}', payload(4)),
        "the fields in another order")
    add("entry_duplicate_dtype", st('{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
                                    payload(4)), "dtype twice in one entry")
    add("entry_duplicate_data_offsets",
        st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"data_offsets":[0,4]}}', payload(4)),
        "data_offsets twice in one entry")
    add("entry_duplicate_extra_field", st('{"a":{"dtype":"F32","x":1,"x":2,"shape":[1],"data_offsets":[0,4]}}',
                                          payload(4)), "an extra field twice: ignored")
    add("entry_missing_dtype", st('{"a":{"shape":[1],"data_offsets":[0,4]}}', payload(4)), "no dtype")
    add("entry_missing_shape", st('{"a":{"dtype":"F32","data_offsets":[0,4]}}', payload(4)), "no shape")
    add("entry_missing_data_offsets", st('{"a":{"dtype":"F32","shape":[1]}}', payload(4)), "no data_offsets")
    add("entry_string", st('{"a":"F32"}'), "a tensor entry that is a string")
    add("entry_null", st('{"a":null}'), "a tensor entry that is null")
    add("entry_number", st('{"a":4}'), "a tensor entry that is a number")
    add("entry_array_form", st('{"a":["F32",[1],[0,4]]}', payload(4)),
        "an entry as the array [dtype, shape, data_offsets] (serde reads a struct from a sequence)")
    add("entry_array_form_short", st('{"a":["F32",[1]]}', payload(4)), "the array form with 2 values")
    add("entry_array_form_long", st('{"a":["F32",[1],[0,4],1]}', payload(4)), "the array form with 4 values")
    add("entry_empty_object", st('{"a":{}}'), "an empty tensor entry")

    def extra(text):
        return st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":%s}}' % text, payload(4))

    add("extra_number_out_of_range", extra("1e400"), "an ignored number beyond the doubles")
    add("extra_number_underflow", extra("-1e-400"), "an ignored number that rounds to zero")
    add("extra_big_integer", extra("123456789012345678901234567890"), "an ignored integer beyond 64 bits")
    add("extra_bad_escape", extra('"\\x"'), "an ignored string with an invalid escape")
    add("extra_surrogate_pair", extra('"\\ud83d\\ude00"'), "an ignored string with an escaped surrogate pair")
    add("extra_duplicate_keys_inside", extra('{"k":1,"k":[2]}'), "an ignored object with a key twice")

    # ---- data_offsets -----------------------------------------------------------------------------
    def offsets(text, data=4):
        return st('{"a":{"dtype":"F32","shape":[1],"data_offsets":%s}}' % text, payload(data))

    add("offsets_one_entry", offsets("[4]"), "data_offsets with 1 entry")
    add("offsets_three_entries", offsets("[0,4,4]"), "data_offsets with 3 entries")
    add("offsets_empty", offsets("[]"), "data_offsets with no entry")
    add("offsets_negative", offsets("[-4,0]"), "a negative offset")
    add("offsets_negative_zero", offsets("[-0,4]"), "-0 (a float to the reference)")
    add("offsets_float", offsets("[0,4.0]"), "a float offset")
    add("offsets_exponent", offsets("[0,4e0]"), "an offset with an exponent")
    add("offsets_string", offsets('["0","4"]'), "string offsets")
    add("offsets_object", offsets('{"0":0,"1":4}'), "data_offsets as an object")
    add("offsets_null", offsets("null"), "data_offsets null")
    add("offsets_past_data", offsets("[0,8]"), "an end past the data")
    add("offsets_u64_max", offsets("[0,18446744073709551615]"), "an end of 2^64-1")
    add("offsets_above_u64", offsets("[0,18446744073709551616]"), "an end of 2^64 (a float to JSON parsers)")
    add("offsets_end_before_begin", st('{"a":%s,"b":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}' % F32_4,
                                       payload(4)), "an end before the begin")
    add("offsets_leading_zero", offsets("[00,4]"), "a number with a leading zero (not JSON)")

    # ---- shapes -----------------------------------------------------------------------------------
    def shape(text, nbytes=4, dtype="F32"):
        return st('{"a":{"dtype":"%s","shape":%s,"data_offsets":[0,%d]}}' % (dtype, text, nbytes), payload(nbytes))

    add("shape_negative", shape("[-1]"), "a negative extent")
    add("shape_negative_zero", shape("[-0]", 0), "an extent of -0")
    add("shape_float", shape("[1.0]"), "a float extent")
    add("shape_string", shape('["1"]'), "a string extent")
    add("shape_not_array", shape("1"), "shape as a number")
    add("shape_object", shape('{"0":1}'), "shape as an object")
    add("shape_null", shape("null"), "shape null")
    add("shape_nested", shape("[[1]]"), "a nested extent")
    add("shape_above_u64", shape("[18446744073709551616]"), "an extent of 2^64")
    add("shape_huge_elements", shape("[1073741824,1073741824]", 8, "F64"), "2^60 elements in 8 bytes")
    add("shape_u64_max_after_zero", shape("[0,18446744073709551615]", 0),
        "an empty tensor with an extent of 2^64-1 after the zero")
    add("shape_2p60_after_zero", shape("[0,1152921504606846976]", 0), "an empty tensor with an extent of 2^60")
    add("shape_2p40_then_zero", shape("[1099511627776,0]", 0), "an empty tensor with an extent of 2^40 first")
    add("shape_zero_then_2p50_2p50", shape("[0,1125899906842624,1125899906842624]", 0),
        "an empty tensor: 0 x 2^50 x 2^50, no overflow in order")
    add("shape_2p50_2p50_then_zero", shape("[1125899906842624,1125899906842624,0]", 0),
        "an empty tensor: 2^50 x 2^50 overflows before the zero")
    add("shape_2p32_2p32_then_zero", shape("[4294967296,4294967296,0]", 0),
        "an empty tensor: 2^32 x 2^32 overflows 64 bits before the zero")
    add("shape_bytes_mismatch", shape("[2]"), "4 bytes for 2 F32 elements")
    add("shape_scalar", shape("[]"), "a 0-d tensor")

    # ---- how the tensors tile the data --------------------------------------------------------------
    def tensors(*items, data=0):
        members = ['"%s":%s' % (name, entry(*rest)) for name, *rest in items]
        return st("{" + ",".join(members) + "}", payload(data), pad=True)

    add("tile_two", tensors(("a", "F32", [1], 0, 4), ("b", "F32", [2], 4, 12), data=12), "two tensors, adjacent")
    add("tile_out_of_order", tensors(("b", "F32", [2], 4, 12), ("a", "F32", [1], 0, 4), data=12),
        "listed against offset order")
    add("tile_gap", tensors(("a", "F32", [1], 0, 4), ("b", "F32", [1], 8, 12), data=12), "4 unused bytes between")
    add("tile_overlap", tensors(("a", "F32", [2], 0, 8), ("b", "F32", [1], 4, 8), data=8), "overlapping tensors")
    add("tile_same_range", tensors(("a", "F32", [1], 0, 4), ("b", "F32", [1], 0, 4), data=4), "two on one range")
    add("tile_not_from_zero", tensors(("a", "F32", [1], 4, 8), data=8), "the first tensor starts at 4")
    add("tile_short_of_end", tensors(("a", "F32", [1], 0, 4), data=8), "4 data bytes after the last tensor")
    add("tile_zero_sized_same_offset",
        tensors(("z1", "F32", [0], 0, 0), ("z2", "I64", [2, 0], 0, 0), ("a", "F32", [1], 0, 4), data=4),
        "two empty tensors at offset 0 before a tensor at 0")
    add("tile_zero_sized_between",
        tensors(("a", "F32", [1], 0, 4), ("z", "F16", [0, 3], 4, 4), ("b", "F32", [1], 4, 8), data=8),
        "an empty tensor between two")
    add("tile_zero_sized_at_end", tensors(("a", "F32", [1], 0, 4), ("z", "F32", [0], 4, 4), data=4),
        "an empty tensor at the end of the data")
    add("tile_zero_sized_past_end", tensors(("a", "F32", [1], 0, 4), ("z", "F32", [0], 8, 8), data=4),
        "an empty tensor past the end of the data")
    add("tile_mixed_dtypes", st('{"__metadata__":{"producer":"oracle"},' + ",".join(
        ['"w":' + entry("F32", [2, 3], 0, 24), '"h":' + entry("BF16", [3], 24, 30), '"m":' + entry("BOOL", [2], 30, 32),
         '"i":' + entry("I64", [1], 32, 40), '"d":' + entry("F64", [1], 40, 48)]) + "}",
        payload(30) + bytes([0, 1]) + payload(16, 1), pad=True), "a typical file: five dtypes, metadata")

    # ---- names that appear twice ------------------------------------------------------------------
    add("duplicate_name_same", st('{"a":%s,"a":%s}' % (F32_4, F32_4), payload(4)), "one tensor listed twice")
    add("duplicate_name_last_wins", st('{"a":%s,"a":%s}' % (F32_4, entry("F32", [2], 0, 8)), payload(8)),
        "a name twice with different entries: the last describes the data")
    add("duplicate_name_first_not_entry", st('{"a":"x","a":%s}' % F32_4, payload(4)),
        "a name twice, the first not a tensor entry")
    add("duplicate_name_first_unknown_dtype", st('{"a":%s,"a":%s}' % (entry("X", [1], 0, 4), F32_4), payload(4)),
        "a name twice, the first with an unknown dtype")
    add("duplicate_name_first_u8", st('{"a":%s,"a":%s}' % (entry("U8", [1], 0, 1), F32_4), payload(4)),
        "a name twice, the first a U8 entry that the second replaces")

    # ---- nesting ----------------------------------------------------------------------------------
    def deep(levels):
        # `levels` containers in all: the top object, the entry, then arrays in an extra field.
        return extra(nested(levels - 2))

    add("nested_100", deep(100), "JSON nested 100 deep (in an extra field)")
    add("nested_127", deep(127), "JSON nested 127 deep: the reference's limit")
    add("nested_128", deep(128), "JSON nested 128 deep: one past the reference's limit")
    add("nested_in_shape", shape(nested(200), 4), "200 nested arrays in a shape")
    add("nested_toplevel", st(nested(300)), "300 nested arrays at the top level")
    return c


def reference_verdict(data):
    """(accepted, error text, tensors) from safetensors.deserialize."""
    try:
        loaded = safetensors.deserialize(data)
    except Exception as error:  # the reference raises SafetensorError (and only that is expected)
        return False, "%s: %s" % (type(error).__name__, error), None
    tensors = [{"name": name, "dtype": view["dtype"], "shape": list(view["shape"]), "data": bytes(view["data"]).hex()}
               for name, view in loaded]
    return True, None, sorted(tensors, key=lambda t: t["name"])


def safe_open_verdict(path):
    """(accepted, metadata, names) from safe_open, which checks the same header."""
    try:
        with safetensors.safe_open(path, framework="numpy") as handle:
            keys = list(handle.keys())
            return True, handle.metadata(), keys
    except Exception:  # a refusal; its text is the one deserialize gave
        return False, None, None


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT
    os.makedirs(out, exist_ok=True)
    for stale in os.listdir(out):
        if stale.endswith(".safetensors"):
            os.remove(os.path.join(out, stale))
    expectations = {"reference": "safetensors %s (numpy %s), safetensors.deserialize" % (
        safetensors.__version__, np.__version__), "cases": {}}
    names = set()
    for name, data, what in cases():
        assert name not in names, name
        names.add(name)
        assert len(data) <= 1024, (name, len(data))
        path = os.path.join(out, name + ".safetensors")
        with open(path, "wb") as handle:
            handle.write(data)
        accepted, error, tensors = reference_verdict(data)
        opened, metadata, keys = safe_open_verdict(path)
        assert opened == accepted, "%s: deserialize and safe_open disagree" % name
        case = {"what": what, "accepted": accepted}
        if accepted:
            assert sorted(keys) == [t["name"] for t in tensors], name
            case["tensors"] = tensors
            case["metadata"] = metadata
        else:
            case["reference_error"] = error
        expectations["cases"][name] = case
    with open(os.path.join(out, "expectations.json"), "w") as handle:
        json.dump(expectations, handle, indent=1, sort_keys=True, ensure_ascii=True)
        handle.write("\n")
    accepted = sum(case["accepted"] for case in expectations["cases"].values())
    print("%d cases (%d accepted) written to %s with %s" % (len(names), accepted, out, expectations["reference"]))


if __name__ == "__main__":
    main()
