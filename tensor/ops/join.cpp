// Joining (cat, stack: copies into one new tensor) and splitting (split,
// chunk: views of the input). Semantics follow torch, including cat's
// tolerance of legacy 1-d empty tensors of shape [0].
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

bool is_legacy_empty(const Tensor& tensor) { return tensor.dim() == 1 && tensor.sizes()[0] == 0; }

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  check_raw_op_inputs("cat", "tensors", tensors);
  TESSERA_CHECK(!tensors.empty(), "cat: needs at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) TESSERA_CHECK(tensors[i].defined(), "cat: tensor {} is undefined", i);
  // The shape reference is the first tensor that is not a legacy [0]; those
  // are skipped when the others have more dims.
  const Tensor* reference = &tensors[0];
  for (const Tensor& tensor : tensors) {
    if (!is_legacy_empty(tensor)) {
      reference = &tensor;
      break;
    }
  }
  TESSERA_CHECK(reference->dim() > 0, "cat: cannot concatenate 0-d tensors (unsqueeze them, or use stack)");
  const int64_t d = wrap_dim(dim, reference->dim(), "cat");
  Shape shape = reference->sizes();
  shape[d] = 0;
  std::vector<const Tensor*> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    TESSERA_CHECK(tensor.dtype() == reference->dtype(), "cat: tensor {} has dtype {}, expected {} like the others", i,
                  dtype_name(tensor.dtype()), dtype_name(reference->dtype()));
    TESSERA_CHECK(tensor.device() == reference->device(), "cat: tensor {} is on {}, expected {} like the others", i,
                  tensor.device().str(), reference->device().str());
    if (is_legacy_empty(tensor) && reference->dim() != 1) continue;
    bool matches = tensor.dim() == reference->dim();
    for (int64_t k = 0; matches && k < tensor.dim(); ++k) {
      matches = k == d || tensor.sizes()[k] == reference->sizes()[k];
    }
    TESSERA_CHECK(matches, "cat: tensor {} has shape {}, which differs from {} outside dim {}", i, tensor.sizes(),
                  reference->sizes(), d);
    shape[d] += tensor.sizes()[d];
    parts.push_back(&tensor);
  }
  Tensor out = empty(shape, {.dtype = reference->dtype(), .device = reference->device()});
  if (out.is_meta()) return out;
  int64_t offset = 0;
  for (const Tensor* part : parts) {
    const int64_t size = part->sizes()[d];
    if (part->numel() > 0) {
      Tensor destination = narrow(out, d, offset, size);
      copy_(destination, *part);
    }
    offset += size;
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_raw_op_inputs("stack", "tensors", tensors);
  TESSERA_CHECK(!tensors.empty(), "stack: needs at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TESSERA_CHECK(tensors[i].defined(), "stack: tensor {} is undefined", i);
    TESSERA_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: tensor {} has shape {}, expected {} like tensor 0",
                  i, tensors[i].sizes(), tensors[0].sizes());
  }
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& tensor : tensors) expanded.push_back(unsqueeze(tensor, d));
  return cat(expanded, d);
}

std::vector<Tensor> split(const Tensor& tensor, int64_t split_size, int64_t dim) {
  check_raw_op_inputs("split", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.defined(), "split: undefined tensor");
  TESSERA_CHECK(tensor.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, tensor.dim(), "split");
  const int64_t size = tensor.sizes()[d];
  TESSERA_CHECK(split_size > 0 || (split_size == 0 && size == 0),
                "split: split_size must be positive, got {} for dim {} of shape {}", split_size, d, tensor.sizes());
  if (size == 0) return {narrow(tensor, d, 0, 0)};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += split_size) sizes.push_back(std::min(split_size, size - start));
  return split_with_sizes(tensor, sizes, d);
}

std::vector<Tensor> split_with_sizes(const Tensor& tensor, const std::vector<int64_t>& sizes, int64_t dim) {
  check_raw_op_inputs("split_with_sizes", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.defined(), "split_with_sizes: undefined tensor");
  TESSERA_CHECK(tensor.dim() > 0, "split_with_sizes: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, tensor.dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t size : sizes) {
    TESSERA_CHECK(size >= 0, "split_with_sizes: negative size in {}", sizes);
    total += size;
  }
  TESSERA_CHECK(total == tensor.sizes()[d], "split_with_sizes: sizes {} sum to {}, but dim {} of shape {} has size {}",
                sizes, total, d, tensor.sizes(), tensor.sizes()[d]);
  std::vector<Tensor> parts;
  parts.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t size : sizes) {
    parts.push_back(narrow(tensor, d, start, size));
    start += size;
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& tensor, int64_t chunks, int64_t dim) {
  check_raw_op_inputs("chunk", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.defined(), "chunk: undefined tensor");
  TESSERA_CHECK(chunks > 0, "chunk: number of chunks must be positive, got {}", chunks);
  TESSERA_CHECK(tensor.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  const int64_t d = wrap_dim(dim, tensor.dim(), "chunk");
  const int64_t size = tensor.sizes()[d];
  // Like torch: every chunk but the last has ceil(size / chunks) elements, so
  // fewer than `chunks` may come back; an empty dim gives `chunks` empty views.
  if (size == 0) return split_with_sizes(tensor, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  return split(tensor, (size + chunks - 1) / chunks, d);
}

}  // namespace tessera::ops
