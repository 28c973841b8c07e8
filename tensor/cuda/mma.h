// Tensor-core instructions for kernel sources (.cu files only): the warp's
// matrix multiply-accumulate mma.sync.aligned.m16n8k16 (D = A B + C, A 16x16
// bf16 or f16, B 16x8, C and D 16x8 f32) and ldmatrix.sync.aligned.m8n8.x4
// (four 8x8 matrices of 16-bit elements from shared memory into the
// registers mma takes). nvcc emits the PTX instructions (sm_80 and newer);
// the simulator emulates each as a warp collective with the PTX ISA's
// register layouts, so a kernel built on them runs, and is checked, in CI.
//
// Which lane holds which elements: tensor/cuda/mma_layout.h.
//
// Numerics. Tensor cores multiply the 16-bit inputs exactly and accumulate
// in at least f32, but NVIDIA does not specify the order or the internal
// precision of the K = 16 sum; measured parts align the products to the
// largest exponent and truncate (Fasi, Higham, Mikaitis, Pranesh, "Numerical
// behavior of NVIDIA tensor cores", PeerJ CS 7:e330, 2021, for V100 to
// A100). The emulation forms the exact products, adds C and the 16
// products in f64 in k order and rounds once to f32: the accurate end of
// what hardware may give. So tests and kernels must bound the error by what
// any f32 accumulation may lose, 17 * 2^-23 * (|C| + sum |A B|) per element
// (16 additions and a rounding, each truncating at most 2^-23 of the
// largest term), and demand bits only where the arithmetic is exact (small
// integers: every partial sum fits f32's 24 bits, in any order).
//
// Simulator: every lane of the warp must reach the same call (.aligned);
// anything else is an error naming the call site (sim::warp_exchange; lanes
// that exit while the others wait show as the others' wait at __any_sync).
// ldmatrix's reads happen in this header, one 16-byte row by each lane that
// gives a row address, so memcheck, racecheck and the byte counts see them,
// attributed to that lane. Neither instruction orders memory between lanes
// (a __syncwarp does). Each warp-wide mma counts its 4096 FLOPs in the
// launch's KernelCounters::flops (tensor-core work, for the roofline).
#pragma once

#include <cstdint>

#include "tensor/cuda/mma_layout.h"
#include "tensor/cuda/portability.h"
#include "tensor/float16_bits.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "tensor/cuda/mma.h: mma.m16n8k16 with bf16 needs sm_80 or newer"
#endif

namespace tessera::cuda {

#if defined(__CUDACC__)

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// `row`: this lane's row address (see the layout above), in shared memory.
// The "memory" clobber keeps the compiler from moving shared stores across it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

#else  // the simulator

namespace mma_emulation {

struct MmaOperands {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};

static_assert(sizeof(MmaOperands) <= sim::kWarpExchangeBytes);

inline uint16_t half_of(uint32_t word, int element) { return static_cast<uint16_t>(word >> (16 * (element & 1))); }
inline uint32_t pair(uint16_t low, uint16_t high) { return static_cast<uint32_t>(low) | static_cast<uint32_t>(high) << 16; }

// The combines run once per warp on the simulator's copies of the lanes'
// registers, not on kernel memory: uninstrumented.

// Gathers A, B and C from the 32 lanes, computes D = A B + C (exact
// products, f64 sum in k order, one rounding) and scatters D.
template <float (*widen)(uint16_t)>
__attribute__((no_sanitize("thread"))) void combine_mma(const void* const* inputs, void* const* outputs) {
  float a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto& operands = *static_cast<const MmaOperands*>(inputs[lane]);
    for (int element = 0; element < 8; ++element) {
      const FragmentPosition at = mma_a_position(lane, element);
      a[at.row][at.col] = widen(half_of(operands.a[element / 2], element));
    }
    for (int element = 0; element < 4; ++element) {
      const FragmentPosition at = mma_b_position(lane, element);
      b[at.row][at.col] = widen(half_of(operands.b[element / 2], element));
    }
    for (int element = 0; element < 4; ++element) {
      const FragmentPosition at = mma_accumulator_position(lane, element);
      c[at.row][at.col] = operands.c[element];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    auto* d = static_cast<float*>(outputs[lane]);
    for (int element = 0; element < 4; ++element) {
      const FragmentPosition at = mma_accumulator_position(lane, element);
      double sum = c[at.row][at.col];
      for (int k = 0; k < 16; ++k) sum += static_cast<double>(a[at.row][k]) * static_cast<double>(b[k][at.col]);
      d[element] = static_cast<float>(sum);
    }
  }
}

// Each lane's input is the 16-byte row it gave the address of: lane 8m + r
// holds row r of matrix m.
template <bool transposed>
__attribute__((no_sanitize("thread"))) void combine_ldmatrix(const void* const* inputs, void* const* outputs) {
  const auto element = [&](int matrix, int row, int col) {
    return static_cast<const uint16_t*>(inputs[matrix * 8 + row])[col];
  };
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane >> 2, in_group = lane % 4;
    auto* r = static_cast<uint32_t*>(outputs[lane]);
    for (int matrix = 0; matrix < 4; ++matrix) {
      r[matrix] = transposed ? pair(element(matrix, 2 * in_group, group), element(matrix, 2 * in_group + 1, group))
                             : pair(element(matrix, group, 2 * in_group), element(matrix, group, 2 * in_group + 1));
    }
  }
}

inline constexpr int64_t kMmaFlops = 2 * 16 * 8 * 16;  // m16n8k16: a multiply and an add per product
inline constexpr sim::WarpExchange kMmaBf16{"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                            sizeof(MmaOperands), sizeof(float[4]),
                                            &combine_mma<float16_bits::float_from_bfloat16>, kMmaFlops};
inline constexpr sim::WarpExchange kMmaF16{"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", sizeof(MmaOperands),
                                           sizeof(float[4]), &combine_mma<float16_bits::float_from_half>, kMmaFlops};
inline constexpr sim::WarpExchange kLdmatrix{"ldmatrix.sync.aligned.m8n8.x4.shared.b16", 16, sizeof(uint32_t[4]),
                                             &combine_ldmatrix<false>};
inline constexpr sim::WarpExchange kLdmatrixTrans{"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", 16,
                                                  sizeof(uint32_t[4]), &combine_ldmatrix<true>};

inline void mma(const sim::WarpExchange& exchange, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                const float (&c)[4], std::source_location site) {
  const MmaOperands operands{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}, {c[0], c[1], c[2], c[3]}};
  float result[4];
  sim::warp_exchange(exchange, &operands, result, site);
  for (int element = 0; element < 4; ++element) d[element] = result[element];
}

// The lane's row is read here, in the kernel's instrumented code.
inline void ldmatrix(const sim::WarpExchange& exchange, uint32_t (&r)[4], const void* row, std::source_location site) {
  sim::check_shared_operand(exchange.instruction, row, 16, 16, site);
  const uint4 bits = *static_cast<const uint4*>(row);
  uint32_t result[4];
  sim::warp_exchange(exchange, &bits, result, site);
  for (int matrix = 0; matrix < 4; ++matrix) r[matrix] = result[matrix];
}

}  // namespace mma_emulation

inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                              std::source_location site = std::source_location::current()) {
  mma_emulation::mma(mma_emulation::kMmaBf16, d, a, b, c, site);
}

inline void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                             std::source_location site = std::source_location::current()) {
  mma_emulation::mma(mma_emulation::kMmaF16, d, a, b, c, site);
}

inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, std::source_location site = std::source_location::current()) {
  mma_emulation::ldmatrix(mma_emulation::kLdmatrix, r, row, site);
}

inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row,
                              std::source_location site = std::source_location::current()) {
  mma_emulation::ldmatrix(mma_emulation::kLdmatrixTrans, r, row, site);
}

#endif

}  // namespace tessera::cuda
