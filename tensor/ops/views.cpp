// View ops: new geometry (shape, strides, offset) over the same Storage, no
// data moved. They run the same on every device, meta included, since only
// the geometry changes; reshape is the one that may fall back to a copy.
#include <optional>

#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

Tensor make_view(const Tensor& tensor, Shape shape, Shape strides, int64_t offset) {
  return Tensor::make(tensor.storage(), std::move(shape), std::move(strides), offset, tensor.dtype());
}

// Resolves one -1 in `shape` so that it holds `numel` elements.
Shape infer_size(const Shape& shape, const Tensor& tensor, const char* op) {
  const int64_t numel = tensor.numel();
  Shape result = shape;
  std::optional<size_t> inferred;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TESSERA_CHECK(!inferred, "{}: shape {} has more than one -1", op, shape);
      inferred = i;
    } else {
      TESSERA_CHECK(shape[i] >= 0, "{}: invalid size {} in shape {}", op, shape[i], shape);
      known *= shape[i];
    }
  }
  if (inferred) {
    TESSERA_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for a tensor of {} elements (shape {})",
                  op, shape, numel, tensor.sizes());
    result[*inferred] = numel / known;
  } else {
    TESSERA_CHECK(known == numel, "{}: shape {} is invalid for a tensor of {} elements (shape {})", op, shape, numel,
                  tensor.sizes());
  }
  return result;
}

// Strides that let `new_shape` view the same elements as (old_shape,
// old_strides) in the same order, or nullopt when no such strides exist. Works
// on runs of dims that are contiguous with each other ("chunks"): a new dim may
// split or merge dims only within one chunk.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape) {
  Shape new_strides(new_shape.size(), 1);
  if (old_shape.empty()) return new_strides;
  const int64_t numel = shape_numel(old_shape);
  if (numel == 0) return old_shape == new_shape ? old_strides : contiguous_strides(new_shape);

  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    const bool chunk_ends = tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                                              old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = old_strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor view(const Tensor& tensor, const Shape& shape) {
  check_raw_op_inputs("view", {{"tensor", tensor}});
  Shape new_shape = infer_size(shape, tensor, "view");
  auto strides = view_strides(tensor.sizes(), tensor.strides(), new_shape);
  TESSERA_CHECK(strides.has_value(),
                "view: shape {} is not compatible with the strides {} of a tensor of shape {} (the elements are "
                "not evenly spaced); use reshape, which copies",
                shape, tensor.strides(), tensor.sizes());
  return make_view(tensor, std::move(new_shape), std::move(*strides), tensor.storage_offset());
}

Tensor reshape(const Tensor& tensor, const Shape& shape) {
  check_raw_op_inputs("reshape", {{"tensor", tensor}});
  Shape new_shape = infer_size(shape, tensor, "reshape");
  if (auto strides = view_strides(tensor.sizes(), tensor.strides(), new_shape)) {
    return make_view(tensor, std::move(new_shape), std::move(*strides), tensor.storage_offset());
  }
  return view(contiguous(tensor), new_shape);
}

Tensor flatten(const Tensor& tensor, int64_t start_dim, int64_t end_dim) {
  check_raw_op_inputs("flatten", {{"tensor", tensor}});
  if (tensor.dim() == 0) return reshape(tensor, {1});
  const int64_t start = wrap_dim(start_dim, tensor.dim(), "flatten");
  const int64_t end = wrap_dim(end_dim, tensor.dim(), "flatten");
  TESSERA_CHECK(start <= end, "flatten: start_dim {} comes after end_dim {} for shape {}", start_dim, end_dim,
                tensor.sizes());
  const Shape& sizes = tensor.sizes();
  Shape shape(sizes.begin(), sizes.begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= sizes[d];
  shape.push_back(merged);
  shape.insert(shape.end(), sizes.begin() + end + 1, sizes.end());
  return reshape(tensor, shape);
}

Tensor permute(const Tensor& tensor, const std::vector<int64_t>& dims) {
  check_raw_op_inputs("permute", {{"tensor", tensor}});
  const int64_t ndim = tensor.dim();
  TESSERA_CHECK(static_cast<int64_t>(dims.size()) == ndim, "permute: dims {} do not match the {} dims of shape {}",
                dims, ndim, tensor.sizes());
  Shape shape(dims.size());
  Shape strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], ndim, "permute");
    TESSERA_CHECK(!seen[d], "permute: dim {} repeats in {} (shape {})", d, dims, tensor.sizes());
    seen[d] = true;
    shape[i] = tensor.sizes()[d];
    strides[i] = tensor.strides()[d];
  }
  return make_view(tensor, std::move(shape), std::move(strides), tensor.storage_offset());
}

Tensor transpose(const Tensor& tensor, int64_t dim0, int64_t dim1) {
  check_raw_op_inputs("transpose", {{"tensor", tensor}});
  if (tensor.dim() == 0) {
    wrap_dim(dim0, 0, "transpose");
    wrap_dim(dim1, 0, "transpose");
    return make_view(tensor, {}, {}, tensor.storage_offset());
  }
  const int64_t a = wrap_dim(dim0, tensor.dim(), "transpose");
  const int64_t b = wrap_dim(dim1, tensor.dim(), "transpose");
  Shape shape = tensor.sizes();
  Shape strides = tensor.strides();
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return make_view(tensor, std::move(shape), std::move(strides), tensor.storage_offset());
}

Tensor narrow(const Tensor& tensor, int64_t dim, int64_t start, int64_t length) {
  check_raw_op_inputs("narrow", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int64_t d = wrap_dim(dim, tensor.dim(), "narrow");
  const int64_t size = tensor.sizes()[d];
  if (start < 0 && start >= -size) start += size;
  TESSERA_CHECK(start >= 0 && length >= 0 && start <= size && length <= size - start,
                "narrow: [{}, {} + {}) is out of range for dim {} of shape {}", start, start, length, d,
                tensor.sizes());
  Shape shape = tensor.sizes();
  shape[d] = length;
  return make_view(tensor, std::move(shape), tensor.strides(), tensor.storage_offset() + start * tensor.strides()[d]);
}

Tensor slice(const Tensor& tensor, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_raw_op_inputs("slice", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.dim() > 0, "slice: cannot slice a 0-d tensor");
  TESSERA_CHECK(step >= 1, "slice: step must be >= 1, got {}", step);
  const int64_t d = wrap_dim(dim, tensor.dim(), "slice");
  const int64_t size = tensor.sizes()[d];
  // Python semantics: negative bounds count from the end, then both clamp to [0, size].
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = tensor.sizes();
  Shape strides = tensor.strides();
  shape[d] = (end - start + step - 1) / step;
  const int64_t offset = tensor.storage_offset() + start * strides[d];
  strides[d] *= step;
  return make_view(tensor, std::move(shape), std::move(strides), offset);
}

Tensor select(const Tensor& tensor, int64_t dim, int64_t index) {
  check_raw_op_inputs("select", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.dim() > 0, "select: cannot select from a 0-d tensor");
  const int64_t d = wrap_dim(dim, tensor.dim(), "select");
  const int64_t size = tensor.sizes()[d];
  TESSERA_CHECK(index >= -size && index < size, "select: index {} is out of range for dim {} of shape {}", index, d,
                tensor.sizes());
  if (index < 0) index += size;
  Shape shape = tensor.sizes();
  Shape strides = tensor.strides();
  const int64_t offset = tensor.storage_offset() + index * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(tensor, std::move(shape), std::move(strides), offset);
}

Tensor squeeze(const Tensor& tensor) {
  check_raw_op_inputs("squeeze", {{"tensor", tensor}});
  Shape shape;
  Shape strides;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.sizes()[d] == 1) continue;
    shape.push_back(tensor.sizes()[d]);
    strides.push_back(tensor.strides()[d]);
  }
  return make_view(tensor, std::move(shape), std::move(strides), tensor.storage_offset());
}

Tensor squeeze(const Tensor& tensor, int64_t dim) {
  check_raw_op_inputs("squeeze", {{"tensor", tensor}});
  const int64_t d = wrap_dim(dim, tensor.dim(), "squeeze");
  Shape shape = tensor.sizes();
  Shape strides = tensor.strides();
  if (tensor.dim() > 0 && shape[d] == 1) {
    shape.erase(shape.begin() + d);
    strides.erase(strides.begin() + d);
  }
  return make_view(tensor, std::move(shape), std::move(strides), tensor.storage_offset());
}

Tensor unsqueeze(const Tensor& tensor, int64_t dim) {
  check_raw_op_inputs("unsqueeze", {{"tensor", tensor}});
  const int64_t d = wrap_dim(dim, tensor.dim() + 1, "unsqueeze");
  Shape shape = tensor.sizes();
  Shape strides = tensor.strides();
  // Any stride works for a size-1 dim; this one keeps a contiguous tensor contiguous.
  const int64_t stride = d < tensor.dim() ? shape[d] * strides[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return make_view(tensor, std::move(shape), std::move(strides), tensor.storage_offset());
}

Tensor expand(const Tensor& tensor, const Shape& shape) {
  check_raw_op_inputs("expand", {{"tensor", tensor}});
  const int64_t ndim = tensor.dim();
  const int64_t new_ndim = static_cast<int64_t>(shape.size());
  TESSERA_CHECK(new_ndim >= ndim, "expand: cannot expand shape {} to {}, which has fewer dims", tensor.sizes(), shape);
  Shape sizes(shape.size());
  Shape strides(shape.size());
  const int64_t leading = new_ndim - ndim;
  for (int64_t i = 0; i < new_ndim; ++i) {
    const int64_t j = i - leading;
    int64_t size = shape[i];
    if (j < 0) {
      TESSERA_CHECK(size >= 0, "expand: new leading dim {} has invalid size {} (shape {} to {})", i, size,
                    tensor.sizes(), shape);
      sizes[i] = size;
      strides[i] = 0;
      continue;
    }
    const int64_t old_size = tensor.sizes()[j];
    if (size == -1) size = old_size;
    if (size == old_size) {
      sizes[i] = size;
      strides[i] = tensor.strides()[j];
      continue;
    }
    TESSERA_CHECK(old_size == 1 && size >= 0,
                  "expand: dim {} of size {} cannot expand to {} (only size-1 dims expand; shape {} to {})", j,
                  old_size, size, tensor.sizes(), shape);
    sizes[i] = size;
    strides[i] = 0;
  }
  return make_view(tensor, std::move(sizes), std::move(strides), tensor.storage_offset());
}

Tensor as_strided(const Tensor& tensor, const Shape& shape, const Shape& strides, int64_t offset) {
  check_raw_op_inputs("as_strided", {{"tensor", tensor}});
  TESSERA_CHECK(offset >= 0, "as_strided: negative storage offset {}", offset);
  try {
    return make_view(tensor, shape, strides, offset);
  } catch (const Error& error) {
    fail("as_strided: {}", error.what());
  }
}

Tensor as_bytes(const Tensor& tensor) {
  check_raw_op_inputs("as_bytes", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.is_contiguous(), "as_bytes: the tensor {} is not contiguous (strides {})", tensor.sizes(),
                tensor.strides());
  const auto size = static_cast<int64_t>(element_size(tensor.dtype()));
  return Tensor::make(tensor.storage(), {tensor.numel() * size}, {1}, tensor.storage_offset() * size, DType::u8);
}

Tensor view_bytes_as(const Tensor& bytes, DType dtype, const Shape& shape) {
  check_raw_op_inputs("view_bytes_as", {{"bytes", bytes}});
  TESSERA_CHECK(bytes.dtype() == DType::u8 && bytes.dim() == 1 && bytes.is_contiguous(),
                "view_bytes_as: needs a contiguous 1-D u8 tensor, got {} {}", dtype_name(bytes.dtype()),
                bytes.sizes());
  const auto size = static_cast<int64_t>(element_size(dtype));
  TESSERA_CHECK(bytes.storage_offset() % size == 0,
                "view_bytes_as: byte offset {} is not a multiple of {}'s {} bytes", bytes.storage_offset(),
                dtype_name(dtype), size);
  TESSERA_CHECK(shape_numel(shape) * size == bytes.numel(), "view_bytes_as: {} bytes are not {} {} ({} bytes)",
                bytes.numel(), dtype_name(dtype), shape, shape_numel(shape) * size);
  return Tensor::make(bytes.storage(), shape, contiguous_strides(shape), bytes.storage_offset() / size, dtype);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t ndim = std::max(a.size(), b.size());
  Shape result(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    // Align from the right; a missing dim counts as size 1.
    const int64_t size_a = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    const int64_t size_b = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    TESSERA_CHECK(size_a == size_b || size_a == 1 || size_b == 1, "{}: shapes {} and {} do not broadcast", op, a, b);
    result[i] = size_a == 1 ? size_b : size_a;
  }
  return result;
}

}  // namespace tessera::ops
