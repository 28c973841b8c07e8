// The multi-tensor copy on the device: many dense segments (copies between
// f32, f64, bf16 and f16, and fills) in one launch, for FSDP's per-parameter
// copy-in, copy-out and casts, which were one or two tiny launches each.
// Block b finds its segment by a binary search over the segments' first
// blocks, then moves its chunk of that segment: 16-byte loads or stores of
// the wider dtype where the segment's addresses line up, one element at a
// time where they do not. Conversions are convert<To>(From), the copy
// kernel's: the same bits as ops::copy_ and ops::fill_ segment by segment.
#include "tensor/cuda/multi_tensor.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"
#include "tensor/element_conversion.h"

namespace tessera::cuda {

namespace {

// Elements of a block's chunk are a multiple of this (every pack width
// divides it), and at least kMinChunk.
constexpr int64_t kWidestPack = 8;
constexpr int64_t kMinChunk = kThreads * kWidestPack;

// A segment's kind: its destination dtype in bits 0-1 and source dtype in
// bits 2-3 (DType's codes of f32, f64, bf16, f16 are 0-3), bit 4 for a fill.
constexpr uint8_t kFill = 16;

// The launch's segments, by value in the kernel argument: 29 bytes per
// segment, 3.7 KiB for kSegmentsPerLaunch.
struct SegmentTable {
  int64_t chunk = 0;                 // elements per block
  void* dst[kSegmentsPerLaunch] = {};
  uint64_t source[kSegmentsPerLaunch] = {};  // the source's address, or the bits of a fill's f64 value
  int64_t count[kSegmentsPerLaunch] = {};
  int32_t first_block[kSegmentsPerLaunch + 1] = {};  // segment s owns blocks [first_block[s], first_block[s + 1])
  int32_t segments = 0;
  uint8_t kind[kSegmentsPerLaunch] = {};

  // The last segment whose first block is at or before `block`.
  __device__ int segment_of(int32_t block) const { return last_at_or_before(first_block, segments, block); }
};

// Calls fn(T{}) for a float dtype's code.
template <typename Fn>
__device__ void visit_float_code(int code, Fn&& fn) {
  switch (code) {
    case 0: return fn(float{});
    case 1: return fn(double{});
    case 2: return fn(BFloat16{});
    default: return fn(Half{});
  }
}

__device__ bool aligned_to(const void* address, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(address) % static_cast<uintptr_t>(bytes) == 0;
}

// A copy's source: dense elements of From.
template <typename From>
struct DenseSource {
  static constexpr int kElementBytes = sizeof(From);
  const From* data;

  template <typename To>
  __device__ To element(int64_t i) const {
    return convert<To>(data[i]);
  }
  template <typename To, int N>
  __device__ Pack<To, N> pack(int64_t first) const {
    const Pack<From, N> values = *reinterpret_cast<const Pack<From, N>*>(data + first);
    Pack<To, N> result;
    for (int lane = 0; lane < N; ++lane) result.values[lane] = convert<To>(values.values[lane]);
    return result;
  }
  __device__ bool packs_at(int64_t first, int lanes) const { return aligned_to(data + first, lanes * kElementBytes); }
};

// A fill's source: one value, converted to the destination's dtype once
// (convert<T>(double), as the fill kernel converts it on the host).
template <typename T>
struct ValueSource {
  static constexpr int kElementBytes = sizeof(T);
  T value;

  template <typename To>
  __device__ To element(int64_t) const {
    return value;
  }
  template <typename To, int N>
  __device__ Pack<To, N> pack(int64_t) const {
    Pack<To, N> result;
    for (int lane = 0; lane < N; ++lane) result.values[lane] = value;
    return result;
  }
  __device__ bool packs_at(int64_t, int) const { return true; }
};

// out[i] = source's element i for i in [begin, end), a thread per element.
template <typename To, typename Source>
__device__ void move_elements(To* out, const Source& source, int64_t begin, int64_t end) {
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) out[i] = source.template element<To>(i);
}

// Part `part` of a segment of `count` elements: chunk elements from
// part * chunk. Where the destination's first aligned pack (at element
// `head`) lines up with the source's, the part moves packs of kLanes from
// there, and part 0 also the elements before `head` and after the last
// whole pack; otherwise it moves its elements one by one.
template <typename To, typename Source>
__device__ void move_part(To* out, const Source& source, int64_t count, int64_t part, int64_t chunk) {
  constexpr int kWidest = sizeof(To) > Source::kElementBytes ? static_cast<int>(sizeof(To)) : Source::kElementBytes;
  constexpr int kLanes = 16 / kWidest;
  constexpr int64_t kOutPackBytes = kLanes * static_cast<int64_t>(sizeof(To));
  const auto address = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % kOutPackBytes);
  const int64_t head = ((kOutPackBytes - address) % kOutPackBytes) / static_cast<int64_t>(sizeof(To));
  if (head >= count || !source.packs_at(head, kLanes)) {
    const int64_t begin = part * chunk;
    move_elements(out, source, begin, begin + chunk < count ? begin + chunk : count);
    return;
  }
  const int64_t packs = (count - head) / kLanes;
  const int64_t first = part * (chunk / kLanes);
  const int64_t last = first + chunk / kLanes < packs ? first + chunk / kLanes : packs;
  auto* out_packs = reinterpret_cast<Pack<To, kLanes>*>(out + head);
  for (int64_t p = first + threadIdx.x; p < last; p += kThreads) {
    out_packs[p] = source.template pack<To, kLanes>(head + p * kLanes);
  }
  if (part == 0) {
    move_elements(out, source, 0, head);
    move_elements(out, source, head + packs * kLanes, count);
  }
}

// At least 4 blocks of kThreads per SM, so up to 64 registers: with the
// block size alone ptxas aims at 40, and the unrolled pack loops of the 20
// dtype pairs spill there.
__global__ void __launch_bounds__(kThreads, 4) copy_segments_kernel(SegmentTable table) {
  const auto block = static_cast<int32_t>(blockIdx.x);
  const int s = table.segment_of(block);
  const int64_t part = block - table.first_block[s];
  const int kind = table.kind[s];
  visit_float_code(kind & 3, [&](auto to) {
    using To = decltype(to);
    To* out = static_cast<To*>(table.dst[s]);
    if (kind & kFill) {
      double value;
      memcpy(&value, &table.source[s], sizeof(value));
      move_part(out, ValueSource<To>{convert<To>(value)}, table.count[s], part, table.chunk);
      return;
    }
    visit_float_code((kind >> 2) & 3, [&](auto from) {
      using From = decltype(from);
      const DenseSource<From> source{reinterpret_cast<const From*>(table.source[s])};
      move_part(out, source, table.count[s], part, table.chunk);
    });
  });
}

uint8_t float_code(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16) {
    refuse_operands("copy_segments", "moves f32, f64, bf16 and f16, got", dtype);
  }
  return static_cast<uint8_t>(dtype);
}

// Elements per block for a launch of `elements`: about kMaxBlocks blocks in
// all, each at least kMinChunk, a multiple of kWidestPack.
int64_t chunk_for(int64_t elements) {
  const int64_t even = (elements + kMaxBlocks - 1) / kMaxBlocks;
  const int64_t rounded = (even + kWidestPack - 1) / kWidestPack * kWidestPack;
  return rounded > kMinChunk ? rounded : kMinChunk;
}

// `buffers` with overlapping ranges of one access merged into one: sources
// that several segments read are declared once (the simulator checks an
// access against the first declared range holding its first byte, which
// must hold the whole access). Ranges that only touch stay apart: two
// allocations may lie end to end, and one range across both is no live
// buffer (memcheck would rightly refuse it).
std::vector<BufferUse> merged_buffers(std::vector<BufferUse> buffers) {
  const auto begin = [](const BufferUse& buffer) { return reinterpret_cast<uintptr_t>(buffer.data); };
  std::sort(buffers.begin(), buffers.end(), [&](const BufferUse& a, const BufferUse& b) {
    return a.access != b.access ? a.access < b.access : begin(a) < begin(b);
  });
  std::vector<BufferUse> merged;
  std::vector<int64_t> parts;
  for (BufferUse& buffer : buffers) {
    const bool dense = buffer.elements.element_bytes == 0;  // (segments are; a strided view keeps its own)
    if (dense && !merged.empty() && merged.back().access == buffer.access &&
        merged.back().elements.element_bytes == 0 &&
        begin(buffer) < begin(merged.back()) + static_cast<uintptr_t>(merged.back().bytes)) {
      BufferUse& last = merged.back();
      const uintptr_t end = std::max(begin(last) + static_cast<uintptr_t>(last.bytes),
                                     begin(buffer) + static_cast<uintptr_t>(buffer.bytes));
      last.bytes = static_cast<int64_t>(end - begin(last));
      ++parts.back();
      continue;
    }
    merged.push_back(std::move(buffer));
    parts.push_back(1);
  }
  for (size_t i = 0; i < merged.size(); ++i) {
    if (parts[i] > 1) merged[i].name += " and " + std::to_string(parts[i] - 1) + " more";
  }
  return merged;
}

// One launch of `batch`: up to kSegmentsPerLaunch non-empty segments.
void launch_batch(const std::vector<const SegmentOperand*>& batch, Stream* stream) {
  SegmentTable table;
  int64_t elements = 0;
  for (const SegmentOperand* segment : batch) elements += segment->count;
  table.chunk = chunk_for(elements);
  LaunchConfig config;
  int64_t blocks = 0;
  for (const SegmentOperand* segment : batch) {
    const int s = table.segments++;
    table.dst[s] = segment->dst;
    table.count[s] = segment->count;
    table.first_block[s] = static_cast<int32_t>(blocks);
    if (segment->src == nullptr) {
      table.kind[s] = static_cast<uint8_t>(float_code(segment->dst_dtype) | kFill);
      std::memcpy(&table.source[s], &segment->value, sizeof(segment->value));
    } else {
      table.kind[s] = static_cast<uint8_t>(float_code(segment->dst_dtype) | float_code(segment->src_dtype) << 2);
      table.source[s] = reinterpret_cast<uintptr_t>(segment->src);
    }
    blocks += (segment->count + table.chunk - 1) / table.chunk;
    config.buffers.insert(config.buffers.end(), segment->buffers.begin(), segment->buffers.end());
  }
  table.first_block[table.segments] = static_cast<int32_t>(blocks);
  config.buffers = merged_buffers(std::move(config.buffers));
  config.grid = dim3(static_cast<unsigned>(blocks));
  config.block = dim3(kThreads);
  config.stream = stream;
  TESSERA_LAUNCH(copy_segments_kernel, config, table);
}

}  // namespace

void copy_segments(const std::vector<SegmentOperand>& segments, Stream* stream) {
  std::vector<const SegmentOperand*> batch;
  for (const SegmentOperand& segment : segments) {
    if (segment.count == 0) continue;
    batch.push_back(&segment);
    if (static_cast<int>(batch.size()) == kSegmentsPerLaunch) {
      launch_batch(batch, stream);
      batch.clear();
    }
  }
  if (!batch.empty()) launch_batch(batch, stream);
}

}  // namespace tessera::cuda
