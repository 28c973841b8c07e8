// Dequantising NF4 weights on the device: one thread an element, each
// reading its code byte and its block's scale code, step and mean
// (tensor/nf4_format.h), so the output is the cpu's, bit for bit.
#include "tensor/cuda/quantization.h"

#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"
#include "tensor/float16_bits.h"
#include "tensor/nf4_format.h"

namespace tessera::cuda {

namespace {

// How an f32 value is stored in each output dtype.
__device__ inline void store_value(float* out, float value) { *out = value; }
__device__ inline void store_value(double* out, float value) { *out = value; }
struct Bf16Word {
  uint16_t bits;
};
struct HalfWord {
  uint16_t bits;
};
__device__ inline void store_value(Bf16Word* out, float value) { out->bits = float16_bits::bfloat16_from_float(value); }
__device__ inline void store_value(HalfWord* out, float value) { out->bits = float16_bits::half_from_float(value); }

template <typename Out>
__global__ void __launch_bounds__(kThreads) nf4_dequantize_kernel(Out* out, const uint8_t* packed, int64_t in,
                                                                  int64_t count) {
  const nf4::RowLayout layout = nf4::RowLayout::of(in);
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const int64_t row = i / in;
    store_value(out + i, nf4::element(packed + row * layout.row_bytes(), layout, i - row * in));
  }
}

}  // namespace

void nf4_dequantize(const Operand& out, const Operand& packed, int64_t in, const KernelLaunch& launch) {
  if (out.count == 0) return;
  const auto* bytes = static_cast<const uint8_t*>(packed.data);
  const LaunchConfig config = config_for(out.count, launch);
  switch (out.dtype) {
    case DType::f32:
      return TESSERA_LAUNCH(nf4_dequantize_kernel<float>, config, static_cast<float*>(out.data), bytes, in, out.count);
    case DType::f64:
      return TESSERA_LAUNCH(nf4_dequantize_kernel<double>, config, static_cast<double*>(out.data), bytes, in,
                            out.count);
    case DType::bf16:
      return TESSERA_LAUNCH(nf4_dequantize_kernel<Bf16Word>, config, static_cast<Bf16Word*>(out.data), bytes, in,
                            out.count);
    case DType::f16:
      return TESSERA_LAUNCH(nf4_dequantize_kernel<HalfWord>, config, static_cast<HalfWord*>(out.data), bytes, in,
                            out.count);
    default: refuse_operands("nf4_dequantize", "dequantises into f32, f64, bf16 or f16, got", out.dtype);
  }
}

}  // namespace tessera::cuda
