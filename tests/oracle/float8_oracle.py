#!/usr/bin/env python3
"""Golden tables for tessera's float8 conversions (tensor/float8_bits.h),
from ml_dtypes (pip install ml_dtypes numpy), an implementation tessera does
not share code with.

  python3 tests/oracle/float8_oracle.py tests/tensor/golden/float8_tables.json

For e4m3 (ml_dtypes.float8_e4m3fn) and e5m2 (ml_dtypes.float8_e5m2):
  decode: the f32 bits of each of the 256 codes ("nan" for a NaN);
  encode: [f32 bits, code] pairs: every finite code's value, the midpoints
          between neighbouring codes (ties go to even) and the f32 values
          one ulp either side, both signs, zeros, and values past the largest
          finite one.
ml_dtypes turns a finite value past the largest into NaN (e4m3) or infinity
(e5m2); the hardware's satfinite conversion that tessera follows gives the
largest finite value of the sign instead, and so does this table there. NaN
inputs are checked in the C++ test (0x7f).
The committed table was made with ml_dtypes 0.6.0 and numpy 2.4.6.
"""
import json
import sys

import ml_dtypes
import numpy as np

FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 0x7E), "e5m2": (ml_dtypes.float8_e5m2, 0x7B)}


def f32_bits(value):
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def code_of(value, dtype, max_code):
    """ml_dtypes' code, saturated where it overflows a finite input."""
    encoded = np.array([value], dtype=np.float32).astype(dtype)
    code = int(encoded.view(np.uint8)[0])
    as_float = float(encoded.astype(np.float32)[0])
    if np.isfinite(value) and not np.isfinite(as_float):
        return (0x80 if value < 0 else 0) | max_code
    return code


def table(dtype, max_code):
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(dtype).astype(np.float32)
    decode = ["nan" if np.isnan(v) else f32_bits(v) for v in values]
    positives = sorted({float(v) for v in values if np.isfinite(v) and v >= 0})
    largest = positives[-1]
    inputs = set(positives)
    for low, high in zip(positives, positives[1:]):
        middle = np.float32((low + high) / 2)
        inputs.update({float(middle), float(np.nextafter(middle, np.float32(0))),
                       float(np.nextafter(middle, np.float32(np.inf)))})
    inputs.update({largest * 1.03, largest * 1.07, largest * 1.5, largest * 4, 1e30, float(np.finfo(np.float32).max),
                   positives[1] / 4, 1e-30})
    encode = []
    for value in sorted(inputs):
        for signed in (value, -value):
            value32 = np.float32(signed)
            encode.append([f32_bits(value32), code_of(value32, dtype, max_code)])
    return {"decode": decode, "encode": encode}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tables = {name: table(dtype, max_code) for name, (dtype, max_code) in FORMATS.items()}
    with open(sys.argv[1], "w") as out:
        json.dump(tables, out, separators=(",", ":"))
        out.write("\n")
    print(f"wrote {sys.argv[1]}: " + ", ".join(f"{name} {len(t['encode'])} encodings" for name, t in tables.items()))


if __name__ == "__main__":
    main()
