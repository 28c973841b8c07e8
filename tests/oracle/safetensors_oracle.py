#!/usr/bin/env python3
"""The Python side of tessera's safetensors interchange, checked with the
reference `safetensors` package (pip install safetensors numpy).

  python3 tests/oracle/safetensors_oracle.py write OUT.safetensors
      Writes the formula tensors below with metadata {"producer": "python"}.
  python3 tests/oracle/safetensors_oracle.py check FILE.safetensors
      Loads a file tessera exported (test_safetensors_export.cpp writes it to
      $TESSERA_EXPORT_FOR_ORACLE) and asserts its names, shapes, dtypes, values
      and metadata {"producer": "tessera"}; prints one "OK ..." line.

The golden tests/checkpoint/golden/python_written.safetensors was made with
  python3 tests/oracle/safetensors_oracle.py write tests/checkpoint/golden/python_written.safetensors
(safetensors 0.8.0, numpy 2.4.6).

numpy has no bfloat16, so safetensors.numpy cannot write BF16: every tensor is
written through safetensors.serialize_file (what safetensors.numpy.save_file
calls) with the BF16 bits made by hand, and BF16 is read back through
safetensors.deserialize. The C++ test recomputes the same formula.
"""
import sys

import numpy as np
import safetensors
from safetensors import safe_open

# name -> (safetensors dtype, shape); every element at flat index i is
# value(dtype, i). The C++ test (kFormulaTensors) holds the same table.
TENSORS = {
    "bf16": ("BF16", (3, 2)),
    "bool": ("BOOL", (7,)),
    "empty": ("F32", (0, 3)),
    "f16": ("F16", (2, 3)),
    "f32": ("F32", (3, 4)),
    "f64": ("F64", (5,)),
    "i32": ("I32", (4,)),
    "i64": ("I64", (2, 2)),
    "scalar": ("F32", ()),
    "u8": ("U8", (6,)),
}

NUMPY_TYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
               "BOOL": np.bool_, "U8": np.uint8}


def base(i):
    """An integer in [-11, 11] that visits every value, signs mixed."""
    return (i * 7) % 23 - 11


def value(dtype, i):
    v = base(i)
    return {"F32": v * 0.25, "F64": v / 3.0, "F16": v * 0.5, "BF16": v * 0.125, "I32": v * 100000 + i,
            "I64": v * 2**40 + i, "BOOL": v > 0, "U8": v + 11}[dtype]


def expected(dtype, shape):
    """The tensor as numpy; BF16 as the float32 values it holds exactly."""
    count = int(np.prod(shape, dtype=np.int64))
    numpy_type = np.float32 if dtype == "BF16" else NUMPY_TYPES[dtype]
    return np.array([value(dtype, i) for i in range(count)], dtype=numpy_type).reshape(shape)


def bf16_bits(values):
    """The BF16 encoding of float32 values that BF16 represents exactly (the top 16 bits)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> 16
    assert np.array_equal((bits << 16).view(np.float32), values), "value not exact in bf16"
    return bits.astype("<u2")


def bf16_values(raw, shape):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)


def write(path):
    arrays = {name: bf16_bits(expected(dtype, shape)) if dtype == "BF16" else expected(dtype, shape)
              for name, (dtype, shape) in TENSORS.items()}  # alive until serialize_file returns
    specs = {name: safetensors.TensorSpec(dtype="bfloat16" if TENSORS[name][0] == "BF16" else array.dtype.name,
                                          shape=array.shape, data_ptr=array.ctypes.data, data_len=array.nbytes)
             for name, array in arrays.items()}
    safetensors.serialize_file(specs, path, metadata={"producer": "python"})
    print(f"wrote {path}: {len(TENSORS)} tensors")


def check(path):
    with open(path, "rb") as file:
        raw_tensors = dict(safetensors.deserialize(file.read()))
    assert sorted(raw_tensors) == sorted(TENSORS), f"names {sorted(raw_tensors)}, expected {sorted(TENSORS)}"
    with safe_open(path, framework="numpy") as opened:
        metadata = opened.metadata()
        assert metadata == {"producer": "tessera"}, f"metadata {metadata}"
        for name, (dtype, shape) in TENSORS.items():
            view = opened.get_slice(name)
            assert view.get_dtype() == dtype, f"{name}: dtype {view.get_dtype()}, expected {dtype}"
            assert tuple(view.get_shape()) == shape, f"{name}: shape {view.get_shape()}, expected {shape}"
            if dtype == "BF16":
                got = bf16_values(raw_tensors[name]["data"], shape)
            else:
                got = opened.get_tensor(name)
            want = expected(dtype, shape)
            assert got.dtype == want.dtype and np.array_equal(got, want), f"{name}: values {got}, expected {want}"
    print(f"OK {path}: {len(TENSORS)} tensors (BF16, BOOL, F16, F32, F64, I32, I64, U8, 0-d, empty) "
          f"match the formula; metadata {metadata}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    write(sys.argv[2]) if sys.argv[1] == "write" else check(sys.argv[2])


if __name__ == "__main__":
    main()
