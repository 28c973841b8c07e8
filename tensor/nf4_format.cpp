// Packing one row into NF4 (tensor/nf4_format.h): block scales, their double
// quantisation, then the codes against the scales dequantisation will use.
#include "tensor/nf4_format.h"

#include <algorithm>
#include <vector>

namespace tessera::nf4 {

void quantize_row(const float* weights, const RowLayout& layout, uint8_t* row) {
  std::vector<float> absmax(static_cast<size_t>(layout.blocks), 0.0f);
  for (int64_t j = 0; j < layout.in; ++j) {
    float& block_max = absmax[static_cast<size_t>(j / kBlockSize)];
    block_max = std::max(block_max, std::fabs(weights[j]));
  }
  double sum = 0.0;
  for (const float scale : absmax) sum += scale;
  const auto mean = static_cast<float>(sum / static_cast<double>(layout.blocks));
  store_f32(mean, row + layout.mean_offset());

  for (int64_t group = 0; group < layout.groups; ++group) {
    const int64_t first = group * kScaleGroupSize;
    const int64_t last = std::min(first + kScaleGroupSize, layout.blocks);
    double spread = 0.0;
    for (int64_t block = first; block < last; ++block) {
      spread = std::max(spread, std::fabs(static_cast<double>(absmax[static_cast<size_t>(block)]) - mean));
    }
    const auto step = static_cast<float>(spread / kMaxScaleCode);
    store_f32(step, row + layout.steps_offset() + 4 * group);
    for (int64_t block = first; block < last; ++block) {
      long code = 0;
      if (step > 0.0f) {
        code = std::lround((static_cast<double>(absmax[static_cast<size_t>(block)]) - mean) / step);
        code = std::clamp(code, -long{kMaxScaleCode}, long{kMaxScaleCode});
      }
      row[layout.scale_codes_offset() + block] = static_cast<uint8_t>(static_cast<int8_t>(code));
    }
  }

  std::fill(row, row + layout.scale_codes_offset(), static_cast<uint8_t>(kZeroCode << 4 | kZeroCode));
  for (int64_t j = 0; j < layout.in; ++j) {
    const float scale = block_scale(row, layout, j / kBlockSize);
    const uint8_t code = scale > 0.0f ? nearest_code(weights[j] / scale) : kZeroCode;
    uint8_t& byte = row[(j / kBlockSize) * kCodeBytesPerBlock + (j % kBlockSize) / 2];
    byte = j % 2 == 0 ? static_cast<uint8_t>((byte & 0x0fu) | (code << 4))
                      : static_cast<uint8_t>((byte & 0xf0u) | code);
  }
}

}  // namespace tessera::nf4
