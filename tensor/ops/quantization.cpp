// Quantised weight formats: NF4 rows (tensor/nf4_format.h) packed on the
// host, dequantised by the device's kernel.
#include <cmath>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/nf4_format.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

int64_t nf4_row_bytes(int64_t in_features) {
  TESSERA_CHECK(in_features > 0, "nf4_row_bytes: rows need at least one element, got {}", in_features);
  return nf4::RowLayout::of(in_features).row_bytes();
}

Tensor nf4_quantize(const Tensor& weight) {
  check_raw_op_inputs("nf4_quantize", {{"weight", weight}});
  TESSERA_CHECK(weight.dim() == 2 && is_floating(weight.dtype()) && weight.size(1) > 0,
                "nf4_quantize: quantises a floating matrix [rows, in] with in > 0, got {} {}",
                dtype_name(weight.dtype()), weight.sizes());
  const nf4::RowLayout layout = nf4::RowLayout::of(weight.size(1));
  const Shape packed_shape{weight.size(0), layout.row_bytes()};
  if (weight.is_meta()) return empty(packed_shape, {.dtype = DType::u8, .device = kMeta});
  // Quantising happens once, on load: on the host, whatever the weight's device.
  const Tensor host = contiguous(to(to(weight, kCPU), DType::f32));
  const Tensor packed = empty(packed_shape, {.dtype = DType::u8, .device = kCPU});
  const auto* rows = static_cast<const float*>(host.raw_data());
  auto* out = static_cast<uint8_t*>(packed.raw_data());
  for (int64_t r = 0; r < weight.size(0); ++r) {
    const float* row = rows + r * layout.in;
    for (int64_t j = 0; j < layout.in; ++j) {
      TESSERA_CHECK(std::isfinite(row[j]), "nf4_quantize: element [{}, {}] of the {} weight is {}: NF4 holds finite "
                    "values only", r, j, weight.sizes(), row[j]);
    }
    nf4::quantize_row(row, layout, out + r * layout.row_bytes());
  }
  return to(packed, weight.device());
}

Tensor nf4_dequantize(const Tensor& packed, int64_t in_features, DType dtype) {
  TESSERA_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16,
                "nf4_dequantize: dequantises into f32, f64, bf16 or f16, got {}", dtype_name(dtype));
  Tensor out = empty({packed.dim() == 2 ? packed.size(0) : 0, in_features},
                     {.dtype = dtype, .device = packed.device()});
  nf4_dequantize_into(out, packed);
  return out;
}

void nf4_dequantize_into(Tensor& out, const Tensor& packed) {
  check_raw_op_inputs("nf4_dequantize", {{"packed", packed}});
  TESSERA_CHECK(packed.dtype() == DType::u8 && packed.dim() == 2,
                "nf4_dequantize: needs packed NF4 rows (u8 [rows, row bytes]), got {} {}", dtype_name(packed.dtype()),
                packed.sizes());
  TESSERA_CHECK(out.dim() == 2 && out.size(0) == packed.size(0) && out.is_contiguous(),
                "nf4_dequantize: the output must be a contiguous [{}, in], got {}", packed.size(0), out.sizes());
  const int64_t in_features = out.size(1);
  TESSERA_CHECK(in_features > 0 && packed.size(1) == nf4_row_bytes(in_features),
                "nf4_dequantize: rows of {} elements pack into {} bytes, but the packed rows have {}", in_features,
                in_features > 0 ? nf4_row_bytes(in_features) : 0, packed.size(1));
  const DType dtype = out.dtype();
  TESSERA_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16,
                "nf4_dequantize: dequantises into f32, f64, bf16 or f16, got {}", dtype_name(dtype));
  TESSERA_CHECK(out.device() == packed.device(), "nf4_dequantize: the output is on {}, the packed rows on {}",
                out.device().str(), packed.device().str());
  if (packed.is_meta() || out.numel() == 0) return;
  kernels(packed.device()).nf4_dequantize(out, contiguous(packed));
}

}  // namespace tessera::ops
