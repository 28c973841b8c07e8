// ops::copy_segments on the cpu: a list of copies and fills gives the bytes
// of copy_ and fill_ run one segment at a time (every float dtype pair, odd
// sizes, misaligned offsets, shapes that differ with one element count), and
// every input the op refuses is refused with a message naming the segment.
#include <doctest/doctest.h>

#include "tensor/ops.h"
#include "tests/tensor/copy_segment_cases.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

const std::vector<int64_t> kOddSizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 257, 0, 1000, 4099};

bool contains_all(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) {
    if (text.find(part) == std::string::npos) {
      MESSAGE(text);
      return false;
    }
  }
  return true;
}

std::string segments_error(const std::vector<CopySegment>& segments) {
  try {
    ops::copy_segments(segments);
  } catch (const Error& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("copy_segments on the cpu: the bytes of copy_ and fill_ one segment at a time") {
  for (const int count : {1, 5, 40, 150}) {
    CAPTURE(count);
    const SegmentCase batched = make_segment_case(kCPU, count, kOddSizes, 7);
    const SegmentCase reference = batched.clone();
    ops::copy_segments(batched.segments());
    copy_one_by_one(reference.segments());
    CHECK(same_destinations(batched, reference));
    if (count > 1) CHECK_FALSE(same_destinations(batched, make_segment_case(kCPU, count, kOddSizes, 7)));  // it wrote
  }
}

TEST_CASE("copy_segments: an empty list and empty segments do nothing") {
  ops::copy_segments({});
  Tensor none = ops::empty({0}, {.dtype = DType::bf16});
  Tensor also_none = ops::empty({0, 4});
  Tensor one = ops::full({2}, 3.0);
  ops::copy_segments({{.dst = none, .src = also_none}, {.dst = one, .value = 1.5}, {.dst = also_none, .value = 2}});
  CHECK(one.to_vector<float>() == std::vector<float>{1.5f, 1.5f});
}

TEST_CASE("copy_segments on meta checks the segments and moves nothing") {
  Tensor dst = ops::empty({4, 3}, {.dtype = DType::bf16, .device = kMeta});
  const Tensor src = ops::empty({12}, {.device = kMeta});
  ops::copy_segments({{.dst = dst, .src = src}, {.dst = dst, .value = 1.0}});  // overlap is not checked without bytes
  CHECK_THROWS_WITH_AS(ops::copy_segments({{.dst = dst, .src = ops::empty({11}, {.device = kMeta})}}),
                       doctest::Contains("has 12 elements, the source f32[11] has 11"), Error);
}

TEST_CASE("copy_segments refuses what it cannot copy, naming the segment") {
  Tensor flat = ops::zeros({64});
  Tensor other = ops::zeros({64}, {.dtype = DType::bf16});
  const Tensor source = ops::ones({8});
  Tensor grid = ops::zeros({4, 6});

  CHECK(segments_error({{.dst = ops::narrow(flat, 0, 0, 8), .src = source}, {.dst = ops::narrow(flat, 0, 8, 4), .src = source}}) ==
        "copy_segments: segment 1: the destination f32[4] has 4 elements, the source f32[8] has 8");
  CHECK(contains_all(segments_error({{.dst = ops::transpose(grid, 0, 1), .value = 1.0}}),
                     {"copy_segments: segment 0: the destination f32[6, 4]", "strides [1, 6] is not contiguous"}));
  CHECK(contains_all(segments_error({{.dst = ops::narrow(flat, 0, 0, 3), .src = ops::slice(source, 0, 0, 6, 2)}}),
                     {"segment 0: the source f32[3]", "strides [2] is not contiguous"}));
  CHECK(contains_all(segments_error({{.dst = ops::narrow(flat, 0, 0, 8), .src = source},
                               {.dst = ops::empty({8}, {.device = kMeta}), .value = 0.0}}),
                     {"segment 1: the destination is on meta, segment 0's destination on cpu; one call runs on one device"}));
  CHECK(contains_all(segments_error({{.dst = ops::narrow(flat, 0, 0, 8), .src = ops::ones({8}, {.dtype = DType::i32})}}),
                     {"segment 0: the source is i32; copy_segments moves f32, f64, bf16 and f16"}));
  CHECK(contains_all(segments_error({{.dst = ops::zeros({2}, {.dtype = DType::boolean}), .value = 1.0}}),
                     {"segment 0: the destination is bool"}));
  CHECK(segments_error({{.dst = Tensor(), .value = 1.0}}) == "copy_segments: segment 0: the destination is an undefined tensor");

  // Overlaps: the result would depend on the order the device runs the segments in.
  CHECK(segments_error({{.dst = ops::narrow(flat, 0, 0, 8), .src = source},
                  {.dst = ops::narrow(other, 0, 0, 8), .value = 1.0},
                  {.dst = ops::narrow(flat, 0, 7, 2), .value = 1.0}}) ==
        "copy_segments: segments 0 and 2 write overlapping bytes (f32[8] at element 0 and f32[2] at element 7 of one "
        "buffer)");
  CHECK(segments_error({{.dst = ops::narrow(flat, 0, 0, 8), .src = ops::narrow(flat, 0, 4, 8)}}) ==
        "copy_segments: segment 0 reads bytes that segment 0 writes (f32[8] at element 4 and f32[8] at element 0 of "
        "one buffer); copy through a temporary");
  // Adjacent segments and a source read twice are fine.
  ops::copy_segments({{.dst = ops::narrow(flat, 0, 0, 8), .src = source},
                      {.dst = ops::narrow(flat, 0, 8, 8), .src = source},
                      {.dst = ops::narrow(flat, 0, 16, 1), .value = 4.0}});
  CHECK(ops::narrow(flat, 0, 0, 17).to_vector<float>() ==
        std::vector<float>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4});
}

TEST_CASE("copy_segments refuses a source that requires grad while grad mode is on") {
  Tensor dst = ops::zeros({3});
  const Tensor src = ops::ones({3}, {.requires_grad = true});
  CHECK_THROWS_WITH_AS(ops::copy_segments({{.dst = dst, .src = src}}),
                       doctest::Contains("ops::copy_segments: input sources[0] requires grad"), Error);
  Tensor leaf = ops::zeros({3}, {.requires_grad = true});
  ops::copy_segments({{.dst = leaf, .value = 2.0}});  // a destination is only written, as with fill_
  CHECK(leaf.to_vector<float>() == std::vector<float>{2, 2, 2});
}
