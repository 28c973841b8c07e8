// DType properties, promotion, and IEEE half-precision conversion.
#include "tensor/dtype.h"

#include "tensor/error.h"

namespace tessera {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
    case DType::u8: return 1;
    case DType::f8e4m3: return 1;
    case DType::f8e5m2: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
    case DType::u8: return "u8";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    if (dtype_name(dtype) == name) return dtype;
  }
  fail("unknown dtype '{}' (expected f32, f64, bf16, f16, f8e4m3, f8e5m2, i32, i64, bool or u8)", name);
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16 ||
         dtype == DType::f8e4m3 || dtype == DType::f8e5m2;
}

DType compute_dtype(DType dtype) {
  if (dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f8e4m3 || dtype == DType::f8e5m2) {
    return DType::f32;
  }
  return dtype;
}

namespace {
int promotion_rank(DType dtype) {
  switch (dtype) {
    case DType::boolean: return 0;
    case DType::u8: return 1;
    case DType::i32: return 1;
    case DType::i64: return 2;
    case DType::f8e4m3: return 3;
    case DType::f8e5m2: return 3;
    case DType::bf16: return 4;
    case DType::f16: return 4;
    case DType::f32: return 5;
    case DType::f64: return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // bf16 with f16 has no exact common 16-bit type: meet in f32.
  if ((a == DType::bf16 && b == DType::f16) || (a == DType::f16 && b == DType::bf16)) return DType::f32;
  // e4m3 with e5m2: bf16 holds every value of both exactly.
  if ((a == DType::f8e4m3 && b == DType::f8e5m2) || (a == DType::f8e5m2 && b == DType::f8e4m3)) return DType::bf16;
  return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

}  // namespace tessera
