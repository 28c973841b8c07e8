// Copies and conversions between dtypes and devices, one at a time or a list
// of segments at once, plus the element readers behind Tensor::to_vector and
// Tensor::item. Meta tensors take part as shapes: copying into meta checks
// shapes only; reading data out of meta is an error.
#include <algorithm>
#include <cstring>

#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera {

namespace {

void check_defined(const Tensor& tensor, const char* op, const char* what) {
  TESSERA_CHECK(tensor.defined(), "{}: {} is an undefined tensor", op, what);
}

// [first, last] byte addresses a tensor can touch; empty tensors touch none.
std::pair<const char*, const char*> byte_extent(const Tensor& tensor) {
  const auto* base = static_cast<const char*>(tensor.storage()->data());
  int64_t first = tensor.storage_offset();
  int64_t last = first;
  for (int64_t d = 0; d < tensor.dim(); ++d) last += (tensor.sizes()[d] - 1) * tensor.strides()[d];
  const auto size = static_cast<int64_t>(tensor.element_size());
  return {base + first * size, base + (last + 1) * size - 1};
}

bool same_geometry(const Tensor& a, const Tensor& b) {
  return a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.dtype() == b.dtype();
}

// A destination whose distinct elements share memory (a stride-0 dim of size
// > 1, as from expand) would be written ambiguously.
bool has_internal_overlap(const Tensor& tensor) {
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.sizes()[d] > 1 && tensor.strides()[d] == 0) return true;
  }
  return false;
}

}  // namespace

void read_elements(const Tensor& tensor, DType as, void* out) {
  check_defined(tensor, "read_elements", "the tensor");
  TESSERA_CHECK(!tensor.is_meta(),
                "read_elements: meta tensor has no data (shape {}); materialise it with to_empty first",
                tensor.sizes());
  if (tensor.numel() == 0) return;
  const GradInputsAllowed values_leave_the_graph;  // like torch's item()/tolist(): reading values loses no gradient
  const Tensor host = ops::to(tensor, kCPU);
  if (host.dtype() == as && host.is_contiguous()) {
    std::memcpy(out, host.raw_data(), static_cast<size_t>(host.nbytes()));
    return;
  }
  const Tensor converted = ops::empty(host.sizes(), {.dtype = as, .device = kCPU});
  kernels(kCPU).copy(converted, host);
  std::memcpy(out, converted.raw_data(), static_cast<size_t>(converted.nbytes()));
}

double Tensor::item() const {
  check_defined(*this, "item", "the tensor");
  TESSERA_CHECK(numel() == 1, "item: tensor of shape {} has {} elements, expected exactly one", sizes(), numel());
  TESSERA_CHECK(!is_meta(), "item: meta tensor has no data (shape {}); materialise it with to_empty first", sizes());
  double value = 0.0;
  read_elements(*this, DType::f64, &value);
  return value;
}

namespace ops {

void copy_(Tensor& dst, const Tensor& src) {
  check_raw_op_inputs("copy_", {{"src", src}});  // dst is written, not read: see ops.h
  check_defined(dst, "copy_", "destination");
  check_defined(src, "copy_", "source");
  // src broadcasts to dst: aligned from the right, each src dim equal or 1.
  bool broadcasts = src.dim() <= dst.dim();
  for (int64_t i = 1; broadcasts && i <= src.dim(); ++i) {
    const int64_t size = src.sizes()[src.dim() - i];
    broadcasts = size == 1 || size == dst.sizes()[dst.dim() - i];
  }
  TESSERA_CHECK(broadcasts, "copy_: source shape {} does not broadcast to destination shape {}", src.sizes(),
                dst.sizes());
  TESSERA_CHECK(!has_internal_overlap(dst),
                "copy_: destination of shape {} and strides {} has elements that share memory (an expanded view); "
                "copy into a contiguous tensor instead",
                dst.sizes(), dst.strides());
  if (dst.is_meta()) return;
  TESSERA_CHECK(!src.is_meta(),
                "copy_: meta tensor has no data (source shape {}) to copy into a {} tensor; materialise it with "
                "to_empty first",
                src.sizes(), dst.device().str());
  if (dst.numel() == 0) return;

  Tensor source = src;
  if (dst.shares_storage_with(src)) {
    if (same_geometry(dst, src)) return;
    const auto [dst_first, dst_last] = byte_extent(dst);
    const auto [src_first, src_last] = byte_extent(src);
    // Overlapping ranges: read from a snapshot so that no element is read after it was overwritten.
    if (dst_first <= src_last && src_first <= dst_last) source = clone(src);
  }
  source = expand(source, dst.sizes());
  // A copy between two devices runs on the one that is not the CPU (its
  // kernel knows how to reach host memory).
  const Device device = dst.device().is_cpu() ? source.device() : dst.device();
  kernels(device).copy(dst, source);
}

void fill_(Tensor& dst, double value) {
  check_defined(dst, "fill_", "destination");
  if (dst.is_meta() || dst.numel() == 0) return;
  const GradInputsAllowed dst_is_only_written;
  // Each distinct element once: an expanded (stride-0) dim is written through its single element.
  Shape sizes = dst.sizes();
  for (int64_t d = 0; d < dst.dim(); ++d) {
    if (dst.strides()[d] == 0) sizes[d] = 1;
  }
  const Tensor target = as_strided(dst, sizes, dst.strides(), dst.storage_offset());
  if (target.is_contiguous()) {
    kernels(dst.device()).fill(target, value);
    return;
  }
  // A strided destination: copy from a broadcast scalar, which the copy kernel walks at any strides.
  const Tensor scalar = full({}, value, {.dtype = dst.dtype(), .device = dst.device()});
  kernels(dst.device()).copy(target, expand(scalar, sizes));
}

void zero_(Tensor& dst) { fill_(dst, 0.0); }

Tensor clone(const Tensor& tensor) {
  check_raw_op_inputs("clone", {{"tensor", tensor}});
  check_defined(tensor, "clone", "the tensor");
  Tensor out = empty(tensor.sizes(), {.dtype = tensor.dtype(), .device = tensor.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  kernels(out.device()).copy(out, tensor);
  return out;
}

Tensor contiguous(const Tensor& tensor) {
  check_raw_op_inputs("contiguous", {{"tensor", tensor}});
  check_defined(tensor, "contiguous", "the tensor");
  return tensor.is_contiguous() ? tensor : clone(tensor);
}

Tensor to(const Tensor& tensor, DType dtype) {
  check_raw_op_inputs("to", {{"tensor", tensor}});
  check_defined(tensor, "to", "the tensor");
  if (tensor.dtype() == dtype) return tensor;
  Tensor out = empty(tensor.sizes(), {.dtype = dtype, .device = tensor.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  kernels(out.device()).copy(out, tensor);
  return out;
}

Tensor to(const Tensor& tensor, Device device) {
  check_raw_op_inputs("to", {{"tensor", tensor}});
  check_defined(tensor, "to", "the tensor");
  if (tensor.device() == device) return tensor;
  Tensor out = empty(tensor.sizes(), {.dtype = tensor.dtype(), .device = device});
  copy_(out, tensor);
  return out;
}

Tensor to_empty(const Tensor& tensor, Device device) {
  check_defined(tensor, "to_empty", "the tensor");
  return empty(tensor.sizes(), {.dtype = tensor.dtype(), .device = device});
}

// ---- copy_segments ----------------------------------------------------------

namespace {

bool moves_floats(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16;
}

void check_segment_tensor(const Tensor& tensor, size_t index, const char* role, const Tensor& first) {
  TESSERA_CHECK(moves_floats(tensor.dtype()), "copy_segments: segment {}: the {} is {}; copy_segments moves f32, f64, "
                "bf16 and f16", index, role, dtype_name(tensor.dtype()));
  TESSERA_CHECK(tensor.device() == first.device(),
                "copy_segments: segment {}: the {} is on {}, segment 0's destination on {}; one call runs on one device",
                index, role, tensor.device().str(), first.device().str());
  TESSERA_CHECK(tensor.is_contiguous(),
                "copy_segments: segment {}: the {} {}{} with strides {} is not contiguous; copy it with copy_", index,
                role, dtype_name(tensor.dtype()), tensor.sizes(), tensor.strides());
}

// The bytes a dense tensor's elements occupy, and which segment and role they belong to.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  const Tensor* tensor = nullptr;
  size_t segment = 0;
};

ByteRange byte_range(const Tensor& tensor, size_t segment) {
  const auto begin = reinterpret_cast<uintptr_t>(tensor.storage()->data()) +
                     static_cast<uintptr_t>(tensor.storage_offset()) * tensor.element_size();
  return {begin, begin + static_cast<uintptr_t>(tensor.nbytes()), &tensor, segment};
}

// " (f32[8] at element 0 and f32[2] at element 7 of one buffer)" when both are views of one storage.
std::string where_both(const ByteRange& a, const ByteRange& b) {
  if (a.tensor->storage() != b.tensor->storage()) return "";
  return fmt::format(" ({}{} at element {} and {}{} at element {} of one buffer)", dtype_name(a.tensor->dtype()),
                     a.tensor->sizes(), a.tensor->storage_offset(), dtype_name(b.tensor->dtype()), b.tensor->sizes(),
                     b.tensor->storage_offset());
}

// A destination that overlaps another destination or a source would make the
// result depend on the order in which the device runs the segments (a cuda
// launch runs its blocks in no order). Sorting the destinations makes this
// O(n log n).
void check_no_overlap(const std::vector<CopySegment>& segments) {
  std::vector<ByteRange> written, read;
  for (size_t index = 0; index < segments.size(); ++index) {
    const CopySegment& segment = segments[index];
    if (segment.dst.numel() == 0) continue;
    written.push_back(byte_range(segment.dst, index));
    if (segment.src.defined()) read.push_back(byte_range(segment.src, index));
  }
  std::sort(written.begin(), written.end(), [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < written.size(); ++k) {
    const ByteRange& a = written[k - 1];
    const ByteRange& b = written[k];
    if (b.begin >= a.end) continue;
    const auto [first, second] = a.segment < b.segment ? std::pair{a, b} : std::pair{b, a};
    fail("copy_segments: segments {} and {} write overlapping bytes{}", first.segment, second.segment,
         where_both(first, second));
  }
  // Disjoint and sorted by start, the destinations are sorted by end too.
  for (const ByteRange& source : read) {
    const auto after = std::partition_point(written.begin(), written.end(),
                                            [&](const ByteRange& range) { return range.end <= source.begin; });
    if (after == written.end() || after->begin >= source.end) continue;
    fail("copy_segments: segment {} reads bytes that segment {} writes{}; copy through a temporary", source.segment,
         after->segment, where_both(source, *after));
  }
}

// `tensor` (contiguous) as a 1-D view of its elements.
Tensor flat_view(const Tensor& tensor) {
  return Tensor::make(tensor.storage(), {tensor.numel()}, {1}, tensor.storage_offset(), tensor.dtype());
}

}  // namespace

void copy_segments(const std::vector<CopySegment>& segments) {
  if (segments.empty()) return;
  std::vector<Tensor> sources;
  for (const CopySegment& segment : segments) sources.push_back(segment.src);
  check_raw_op_inputs("copy_segments", "sources", sources);  // destinations are written, not read: see ops.h
  const Tensor& first = segments.front().dst;
  for (size_t index = 0; index < segments.size(); ++index) {
    const CopySegment& segment = segments[index];
    TESSERA_CHECK(segment.dst.defined(), "copy_segments: segment {}: the destination is an undefined tensor", index);
    check_segment_tensor(segment.dst, index, "destination", first);
    if (!segment.src.defined()) continue;
    check_segment_tensor(segment.src, index, "source", first);
    TESSERA_CHECK(segment.src.numel() == segment.dst.numel(),
                  "copy_segments: segment {}: the destination {}{} has {} elements, the source {}{} has {}", index,
                  dtype_name(segment.dst.dtype()), segment.dst.sizes(), segment.dst.numel(),
                  dtype_name(segment.src.dtype()), segment.src.sizes(), segment.src.numel());
  }
  if (first.is_meta()) return;
  check_no_overlap(segments);
  std::vector<CopySegment> flat;
  flat.reserve(segments.size());
  for (const CopySegment& segment : segments) {
    if (segment.dst.numel() == 0) continue;
    flat.push_back({flat_view(segment.dst), segment.src.defined() ? flat_view(segment.src) : Tensor(), segment.value});
  }
  if (!flat.empty()) kernels(first.device()).copy_segments(flat);
}

}  // namespace ops

}  // namespace tessera
