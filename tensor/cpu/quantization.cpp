// Dequantising packed weights on the cpu: NF4 rows (tensor/nf4_format.h).
#include <algorithm>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/float16_bits.h"
#include "tensor/nf4_format.h"
#include "tensor/parallel.h"

namespace tessera::cpu {

namespace {

// Calls store(out_row, j, value) for every element of every row, rows in parallel.
template <typename Store>
void for_each_dequantized(const Tensor& out, const Tensor& packed, const Store& store) {
  const int64_t in = out.size(1);
  const nf4::RowLayout layout = nf4::RowLayout::of(in);
  const auto* rows = static_cast<const uint8_t*>(packed.raw_data());
  parallel_for(out.size(0), std::max<int64_t>(1, 4096 / in), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row = rows + r * layout.row_bytes();
      for (int64_t j = 0; j < in; ++j) store(r * in + j, nf4::element(row, layout, j));
    }
  });
}

}  // namespace

void nf4_dequantize(const Tensor& out, const Tensor& packed) {
  switch (out.dtype()) {
    case DType::f32: {
      auto* data = static_cast<float*>(out.raw_data());
      return for_each_dequantized(out, packed, [data](int64_t i, float value) { data[i] = value; });
    }
    case DType::f64: {
      auto* data = static_cast<double*>(out.raw_data());
      return for_each_dequantized(out, packed, [data](int64_t i, float value) { data[i] = value; });
    }
    case DType::bf16: {
      auto* data = static_cast<uint16_t*>(out.raw_data());
      return for_each_dequantized(
          out, packed, [data](int64_t i, float value) { data[i] = float16_bits::bfloat16_from_float(value); });
    }
    case DType::f16: {
      auto* data = static_cast<uint16_t*>(out.raw_data());
      return for_each_dequantized(
          out, packed, [data](int64_t i, float value) { data[i] = float16_bits::half_from_float(value); });
    }
    default:
      tessera::fail("cpu::nf4_dequantize: dequantises into f32, f64, bf16 or f16, got {}", dtype_name(out.dtype()));
  }
}

}  // namespace tessera::cpu
