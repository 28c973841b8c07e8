// Segment lists for the tests of ops::copy_segments on every device (the cpu
// here, cuda in tests/cuda): segments of odd sizes at misaligned offsets of
// one flat buffer per float dtype, every pair of f32, f64, bf16 and f16, and
// fills, over values that exercise the conversions (ties, subnormals,
// overflow, NaN, infinities, -0). The reference they are held to, bit for
// bit: the same segments one at a time through ops::copy_ and ops::fill_.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/ops.h"

namespace tessera::testing {

inline constexpr std::array<DType, 4> kFloatDTypes = {DType::f32, DType::f64, DType::bf16, DType::f16};

// Where one segment lies: `count` elements at dst_offset of destination
// buffer dst_pool (viewed as dst_shape), from src_offset of source buffer
// src_pool, or a fill with `value` when src_pool is -1.
struct SegmentPlan {
  int dst_pool = 0;
  int64_t dst_offset = 0;
  Shape dst_shape;
  int src_pool = -1;
  int64_t src_offset = 0;
  int64_t count = 0;
  double value = 0.0;
};

struct SegmentCase {
  std::vector<Tensor> destinations;  // one flat buffer per kFloatDTypes entry
  std::vector<Tensor> sources;
  std::vector<SegmentPlan> plan;

  std::vector<CopySegment> segments() const {
    std::vector<CopySegment> segments;
    for (const SegmentPlan& piece : plan) {
      CopySegment segment;
      segment.dst = ops::view(ops::narrow(destinations[static_cast<size_t>(piece.dst_pool)], 0, piece.dst_offset,
                                          piece.count),
                              piece.dst_shape);
      if (piece.src_pool >= 0) {
        segment.src = ops::narrow(sources[static_cast<size_t>(piece.src_pool)], 0, piece.src_offset, piece.count);
      }
      segment.value = piece.value;
      segments.push_back(segment);
    }
    return segments;
  }
  // The same plan over copies of the buffers, for the reference.
  SegmentCase clone() const {
    SegmentCase copy{{}, {}, plan};
    for (const Tensor& buffer : destinations) copy.destinations.push_back(ops::clone(buffer));
    for (const Tensor& buffer : sources) copy.sources.push_back(ops::clone(buffer));
    return copy;
  }
};

// f64 values at every scale: normal draws times powers of ten, and at fixed
// positions values whose conversions are edge cases.
inline Tensor awkward_values(int64_t count, uint64_t seed) {
  std::vector<double> values = ops::randn({count}, PhiloxKey{seed, 1}, {.dtype = DType::f64}).to_vector<double>();
  const double specials[] = {0.0,
                             -0.0,
                             1.0 + std::ldexp(1.0, -8),  // a bf16 tie: rounds to even
                             1.0 + 3 * std::ldexp(1.0, -8),
                             1.0 + std::ldexp(1.0, -11),  // an f16 tie
                             65504.0,
                             65520.0,  // f16 overflow
                             1e-8,     // an f16 subnormal
                             1e-40,    // an f32 subnormal
                             1e300,
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN()};
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t special = i % 29;
    if (special < std::size(specials)) {
      values[i] = specials[special];
    } else {
      values[i] *= std::pow(10.0, static_cast<double>(static_cast<int64_t>(i % 11) - 5));
    }
  }
  return ops::from_vector(values, {count}, {.dtype = DType::f64});
}

// `count` segments on `device` with sizes cycling through `sizes`: segment i
// writes kFloatDTypes[i % 4] from kFloatDTypes[(i / 4) % 4], every fifth is
// a fill, destinations start 0-2 elements after the previous one's end (the
// gaps must keep their bytes), and 2-D destinations take 1-D sources.
inline SegmentCase make_segment_case(Device device, int count, const std::vector<int64_t>& sizes, uint64_t seed) {
  SegmentCase result;
  std::array<int64_t, 4> used{};
  int64_t longest = 1;
  for (int i = 0; i < count; ++i) {
    SegmentPlan piece;
    piece.count = sizes[static_cast<size_t>(i) % sizes.size()];
    piece.dst_pool = i % 4;
    piece.dst_offset = used[static_cast<size_t>(piece.dst_pool)] + i % 3;
    used[static_cast<size_t>(piece.dst_pool)] = piece.dst_offset + piece.count;
    piece.dst_shape = piece.count % 3 == 0 && piece.count > 0 ? Shape{3, piece.count / 3} : Shape{piece.count};
    if (i % 5 == 4) {
      piece.value = i % 2 == 0 ? 0.0 : -2.5 + i;
    } else {
      piece.src_pool = (i / 4) % 4;
      piece.src_offset = (7 * i) % 13;
    }
    longest = std::max(longest, piece.count);
    result.plan.push_back(piece);
  }
  for (size_t pool = 0; pool < kFloatDTypes.size(); ++pool) {
    const int64_t elements = used[pool] + 3;
    Tensor destination = ops::empty({elements}, {.dtype = kFloatDTypes[pool], .device = device});
    ops::copy_(destination, awkward_values(elements, seed + pool));
    result.destinations.push_back(destination);
    Tensor source = ops::empty({longest + 13}, {.dtype = kFloatDTypes[pool], .device = device});
    ops::copy_(source, awkward_values(longest + 13, seed + 10 + pool));
    result.sources.push_back(source);
  }
  return result;
}

// The reference: every segment by copy_ or fill_, one after another.
inline void copy_one_by_one(const std::vector<CopySegment>& segments) {
  for (CopySegment segment : segments) {
    if (segment.src.defined()) {
      ops::copy_(segment.dst, ops::view(segment.src, segment.dst.sizes()));
    } else {
      ops::fill_(segment.dst, segment.value);
    }
  }
}

inline std::vector<unsigned char> bytes_of(const Tensor& tensor) {
  const Tensor host = ops::contiguous(ops::to(tensor, kCPU));
  std::vector<unsigned char> bytes(static_cast<size_t>(host.nbytes()));
  if (!bytes.empty()) std::memcpy(bytes.data(), host.raw_data(), bytes.size());
  return bytes;
}

// Every byte of every destination buffer (segments and gaps) is the reference's.
inline bool same_destinations(const SegmentCase& a, const SegmentCase& b) {
  for (size_t pool = 0; pool < a.destinations.size(); ++pool) {
    if (bytes_of(a.destinations[pool]) != bytes_of(b.destinations[pool])) return false;
  }
  return true;
}

}  // namespace tessera::testing
