// NF4, QLoRA's 4-bit NormalFloat (Dettmers et al. 2023, "QLoRA"), packed row
// by row, written once for the cpu kernels and the cuda kernels (host and
// device alike), so that a dequantised weight has the same bits everywhere.
//
// A weight [rows, in] is cut along each row into blocks of 64 (the last one
// padded). A block stores, for each element, the 4-bit code of the NF4 value
// nearest to element / scale, where scale is the block's absolute maximum.
// The scales are quantised again (QLoRA's double quantisation): each is
// stored as an int8 code of its distance from the row's mean scale, with an
// f32 step per group of 256 blocks, so that a scale costs 8 bits and not 32.
//
// Why by rows, and not over the flattened tensor as bitsandbytes does: a
// row's bytes depend on that row alone, so FSDP shards the packed weight by
// rows exactly as it shards a dense one, for any world size (padding rows,
// never splitting a block), and quantising a shard gives the bytes of the
// same rows of the quantised whole. The mean is the row's for the same
// reason (torchao's is the tensor's).
//
// One packed row, in bytes (tensor dtype u8, shape [rows, row_bytes]):
//   [0, 32 B)               codes: element j of block b in byte 32 b + (j % 64) / 2,
//                           the high nibble for even j (bitsandbytes' order);
//   [32 B, 33 B)            the blocks' scale codes, int8 (-127..127);
//   [33 B, 33 B + 4 G)      the groups' steps, f32 little-endian;
//   [33 B + 4 G, row_bytes) the row's mean scale, f32 little-endian;
// with B = ceil(in / 64) blocks and G = ceil(B / 256) groups. For in = 4096
// a row is 2120 bytes: 0.518 bytes a weight, against 2 for bf16.
//
// Dequantised: scale'(b) = fma(code(b), step(g), mean) in f32, and
// element = value(nibble) * scale', rounded once into the output dtype.
// Quantised (on the host): the nibble of the NF4 value nearest to
// element / scale'(b), the lower one on a tie, from the stored scale'(b) (the
// one dequantisation uses, so that the round trip is the best it can be);
// a block whose scale' is not positive stores zeros.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/float16_bits.h"
#include "tensor/host_device.h"

namespace tessera::nf4 {

inline constexpr int64_t kBlockSize = 64;        // weights per scale (QLoRA's)
inline constexpr int64_t kScaleGroupSize = 256;  // scales per f32 step (QLoRA's second level)
inline constexpr int64_t kCodeBytesPerBlock = kBlockSize / 2;
inline constexpr uint8_t kZeroCode = 7;          // value(7) == 0
inline constexpr int kMaxScaleCode = 127;

// The 16 NF4 values: quantiles of N(0, 1) scaled to [-1, 1] with an exact
// zero, as bitsandbytes and torchao tabulate them (float32).
TESSERA_HOST_DEVICE inline float value(uint8_t code) {
  switch (code & 0xfu) {
    case 0: return -1.0f;
    case 1: return -0.6961928009986877f;
    case 2: return -0.5250730514526367f;
    case 3: return -0.39491748809814453f;
    case 4: return -0.28444138169288635f;
    case 5: return -0.18477343022823334f;
    case 6: return -0.09105003625154495f;
    case 7: return 0.0f;
    case 8: return 0.07958029955625534f;
    case 9: return 0.16093020141124725f;
    case 10: return 0.24611230194568634f;
    case 11: return 0.33791524171829224f;
    case 12: return 0.44070982933044434f;
    case 13: return 0.5626170039176941f;
    case 14: return 0.7229568362236023f;
    default: return 1.0f;
  }
}

// The nibble of the value nearest to `normalized`, the lower one on a tie
// (compared in f64, where the midpoints are exact).
TESSERA_HOST_DEVICE inline uint8_t nearest_code(float normalized) {
  uint8_t code = 0;
  for (uint8_t next = 1; next < 16; ++next) {
    const double midpoint = (static_cast<double>(value(next - 1)) + static_cast<double>(value(next))) / 2.0;
    if (static_cast<double>(normalized) > midpoint) code = next;
  }
  return code;
}

// Where a packed row keeps what, for rows of `in` elements.
struct RowLayout {
  int64_t in = 0;
  int64_t blocks = 0;
  int64_t groups = 0;

  TESSERA_HOST_DEVICE static RowLayout of(int64_t in) {
    const int64_t blocks = (in + kBlockSize - 1) / kBlockSize;
    return {in, blocks, (blocks + kScaleGroupSize - 1) / kScaleGroupSize};
  }
  TESSERA_HOST_DEVICE int64_t scale_codes_offset() const { return blocks * kCodeBytesPerBlock; }
  TESSERA_HOST_DEVICE int64_t steps_offset() const { return scale_codes_offset() + blocks; }
  TESSERA_HOST_DEVICE int64_t mean_offset() const { return steps_offset() + 4 * groups; }
  TESSERA_HOST_DEVICE int64_t row_bytes() const { return mean_offset() + 4; }
};

TESSERA_HOST_DEVICE inline float load_f32(const uint8_t* bytes) {
  const uint32_t word = static_cast<uint32_t>(bytes[0]) | (static_cast<uint32_t>(bytes[1]) << 8) |
                        (static_cast<uint32_t>(bytes[2]) << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
  return float16_bits::float_of(word);
}

inline void store_f32(float value, uint8_t* bytes) {
  const uint32_t word = float16_bits::bits_of(value);
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(word >> (8 * i));
}

// Block b's dequantised scale in a packed row.
TESSERA_HOST_DEVICE inline float block_scale(const uint8_t* row, const RowLayout& layout, int64_t block) {
  const auto code = static_cast<int8_t>(row[layout.scale_codes_offset() + block]);
  const float step = load_f32(row + layout.steps_offset() + 4 * (block / kScaleGroupSize));
  return fmaf(static_cast<float>(code), step, load_f32(row + layout.mean_offset()));
}

// Element j of a packed row, dequantised in f32.
TESSERA_HOST_DEVICE inline float element(const uint8_t* row, const RowLayout& layout, int64_t j) {
  const int64_t block = j / kBlockSize;
  const uint8_t byte = row[block * kCodeBytesPerBlock + (j % kBlockSize) / 2];
  const uint8_t nibble = (j % 2 == 0) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xfu);
  return value(nibble) * block_scale(row, layout, block);
}

// Packs one row of `layout.in` finite f32 weights into `row` (row_bytes).
void quantize_row(const float* weights, const RowLayout& layout, uint8_t* row);

// Half the widest gap between neighbouring values (-1 and -0.696):
// |x - value(nearest_code(x))| <= this for |x| <= 1.
inline constexpr double kMaxHalfGap = (1.0 - 0.6961928009986877) / 2.0;

}  // namespace tessera::nf4
