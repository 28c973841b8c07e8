// ops::copy_segments on cuda: the bytes of copy_ and fill_ run one segment at
// a time, on cuda and on the cpu (every float dtype pair, odd sizes,
// misaligned offsets, fills); on the simulator one launch per 128 segments
// with blocks spread over them by size, each byte read and written once.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/ops.h"
#include "tensor/stream.h"
#include "tests/cuda/counted_bytes.h"
#include "tests/tensor/copy_segment_cases.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

const Device kCuda(DeviceType::cuda);
const std::vector<int64_t> kOddSizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 257, 0, 1000, 4099};

struct Launched {
  int64_t launches = 0, blocks = 0;
};

// The launches and blocks of copy_segments_kernel while `run` ran; nullopt
// on a GPU, where nothing counts.
template <typename Run>
std::optional<Launched> copy_segment_launches(Run run) {
#if TESSERA_HAVE_CUDA_SIM
  current_stream(kCuda)->synchronize();
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(kCuda)->synchronize();
  Launched launched;
  for (const auto& [name, counters] : cuda::sim::kernel_counters()) {
    if (name != "copy_segments_kernel") continue;
    launched.launches += counters.launches;
    launched.blocks += counters.blocks;
  }
  return launched;
#else
  run();
  return std::nullopt;
#endif
}

// The case on cuda, copied one segment at a time on cuda and on the cpu.
void check_against_one_by_one(int count, const std::vector<int64_t>& sizes, uint64_t seed) {
  const SegmentCase batched = make_segment_case(kCuda, count, sizes, seed);
  const SegmentCase on_cuda = batched.clone();
  SegmentCase on_cpu = batched.clone();
  for (Tensor& buffer : on_cpu.destinations) buffer = ops::to(buffer, kCPU);
  for (Tensor& buffer : on_cpu.sources) buffer = ops::to(buffer, kCPU);
  const std::optional<Launched> launched = copy_segment_launches([&] { ops::copy_segments(batched.segments()); });
  copy_one_by_one(on_cuda.segments());
  copy_one_by_one(on_cpu.segments());
  CHECK(same_destinations(batched, on_cuda));
  CHECK(same_destinations(batched, on_cpu));
  if (launched) CHECK(launched->launches == (count + 127) / 128);
}

}  // namespace

TEST_CASE("copy_segments on cuda: the bytes of copy_ and fill_ one segment at a time, on cuda and on the cpu") {
  for (const int count : {1, 5, 40, 128, 150}) {
    CAPTURE(count);
    check_against_one_by_one(count, kOddSizes, 11);
  }
  // Segments of many blocks next to small ones, and empty ones.
  check_against_one_by_one(9, {70001, 5, 0, 20000, 768, 1, 131072, 3, 9999}, 12);
}

TEST_CASE("copy_segments on cuda: offsets that line up after a head take packs, for every dtype pair") {
  for (const DType to : kFloatDTypes) {
    for (const DType from : kFloatDTypes) {
      CAPTURE(dtype_name(to));
      CAPTURE(dtype_name(from));
      const Tensor destination = ops::zeros({9 * 1100}, {.dtype = to, .device = kCuda});
      const Tensor source = ops::to(ops::to(awkward_values(1100, 3), from), kCuda);
      std::vector<CopySegment> segments;
      for (int64_t offset = 0; offset < 9; ++offset) {
        const int64_t count = 1000 + offset;  // a tail after the last whole pack
        segments.push_back({ops::narrow(destination, 0, offset * 1100 + offset, count),
                            ops::narrow(source, 0, offset, count)});
      }
      const Tensor reference = ops::clone(destination);
      ops::copy_segments(segments);
      for (int64_t offset = 0; offset < 9; ++offset) {
        Tensor piece = ops::narrow(reference, 0, offset * 1100 + offset, 1000 + offset);
        ops::copy_(piece, ops::narrow(source, 0, offset, 1000 + offset));
      }
      CHECK(bytes_of(destination) == bytes_of(reference));
    }
  }
}

TEST_CASE("copy_segments on cuda: an empty list launches nothing, a list of 300 three launches") {
  const std::optional<Launched> none = copy_segment_launches([] { ops::copy_segments({}); });
  if (none) CHECK(none->launches == 0);
  Tensor flat = ops::zeros({300 * 5}, {.dtype = DType::bf16, .device = kCuda});
  const Tensor source = ops::ones({5}, {.device = kCuda});
  std::vector<CopySegment> segments;
  for (int64_t i = 0; i < 300; ++i) {
    segments.push_back(i % 2 == 0 ? CopySegment{.dst = ops::narrow(flat, 0, 5 * i, 5), .src = source}
                                  : CopySegment{.dst = ops::narrow(flat, 0, 5 * i, 5), .value = 2.0});
  }
  const std::optional<Launched> launched = copy_segment_launches([&] { ops::copy_segments(segments); });
  if (launched) {
    CHECK(launched->launches == 3);
    CHECK(launched->blocks == 300);  // one block each: small segments
  }
  const std::vector<float> values = ops::to(flat, DType::f32).to_vector<float>();
  for (int64_t i = 0; i < 300 * 5; ++i) CHECK(values[static_cast<size_t>(i)] == ((i / 5) % 2 == 0 ? 1.0f : 2.0f));
}

TEST_CASE("copy_segments on cuda: blocks follow the sizes, and every byte moves once") {
  // One segment of 2^20 elements beside 100 of 768 (a GPT-2 bias): the large
  // one takes most of the blocks, a small one one block.
  const Tensor big_source = ops::to(ops::randn({int64_t{1} << 20}, PhiloxKey{5, 1}), kCuda);
  const Tensor small_source = ops::to(ops::randn({100 * 768}, PhiloxKey{5, 2}), kCuda);
  Tensor big = ops::empty({int64_t{1} << 20}, {.dtype = DType::bf16, .device = kCuda});
  Tensor small = ops::empty({100 * 768}, {.dtype = DType::bf16, .device = kCuda});
  std::vector<CopySegment> segments{{.dst = big, .src = big_source}};
  for (int64_t i = 0; i < 100; ++i) {
    segments.push_back({.dst = ops::narrow(small, 0, 768 * i, 768), .src = ops::narrow(small_source, 0, 768 * i, 768)});
  }
  const int64_t ideal = (int64_t{1} << 20) * (4 + 2) + 100 * 768 * (4 + 2);
  std::optional<Launched> launched;
  const std::optional<CountedBytes> bytes =
      counted_bytes([&] { launched = copy_segment_launches([&] { ops::copy_segments(segments); }); });
  if (launched) {
    CHECK(launched->launches == 1);
    INFO("blocks: " << launched->blocks);
    CHECK(launched->blocks >= 100 + 256);   // the large segment is split
    CHECK(launched->blocks <= 1024 + 101);  // about kMaxBlocks in all, whatever the elements
  }
  if (bytes) CHECK(bytes->total() == ideal);
  CHECK(bytes_of(big) == bytes_of(ops::to(big_source, DType::bf16)));
  CHECK(bytes_of(small) == bytes_of(ops::to(small_source, DType::bf16)));
}

TEST_CASE("copy_segments on cuda refuses segments on two devices") {
  Tensor on_cuda = ops::zeros({4}, {.device = kCuda});
  const Tensor on_cpu = ops::ones({4});
  CHECK_THROWS_WITH_AS(ops::copy_segments({{.dst = on_cuda, .src = on_cpu}}),
                       doctest::Contains("copy_segments: segment 0: the source is on cpu, segment 0's destination on "
                                         "cuda:0; one call runs on one device"),
                       Error);
}
