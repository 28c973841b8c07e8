// Differentiable joining and splitting: the backward of a join splits the
// gradient (narrow/select views of it), the backward of a split joins the
// gradients (zeros for pieces that received none).
#include <optional>

#include "autograd/functions.h"
#include "autograd/functions/recording.h"

namespace tessera {

namespace {

using autograd::Node;
using autograd::TensorList;

class CatBackward final : public Node {
 public:
  CatBackward(int64_t dim, const std::vector<Tensor>& inputs) : dim_(dim) {
    sizes_.reserve(inputs.size());
    dtypes_.reserve(inputs.size());
    for (const Tensor& input : inputs) {
      sizes_.push_back(input.size(dim));
      dtypes_.push_back(input.dtype());
    }
  }
  std::string name() const override { return "CatBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList result(sizes_.size());
    int64_t offset = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (autograd::needs_grad(*this, i)) result[i] = ops::to(ops::narrow(grads[0], dim_, offset, sizes_[i]), dtypes_[i]);
      offset += sizes_[i];
    }
    return result;
  }

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
  std::vector<DType> dtypes_;
};

class StackBackward final : public Node {
 public:
  StackBackward(int64_t dim, const std::vector<Tensor>& inputs) : dim_(dim) {
    dtypes_.reserve(inputs.size());
    for (const Tensor& input : inputs) dtypes_.push_back(input.dtype());
  }
  std::string name() const override { return "StackBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList result(dtypes_.size());
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      if (autograd::needs_grad(*this, i)) {
        result[i] = ops::to(ops::select(grads[0], dim_, static_cast<int64_t>(i)), dtypes_[i]);
      }
    }
    return result;
  }

 private:
  int64_t dim_;
  std::vector<DType> dtypes_;
};

// split, chunk: one output per piece; the input's gradient is the pieces'
// gradients joined back, zeros where a piece got none.
class SplitBackward final : public Node {
 public:
  SplitBackward(const char* name, int64_t dim, const std::vector<Tensor>& pieces, const Tensor& input)
      : name_(name), dim_(dim), dtype_(input.dtype()), device_(input.device()) {
    shapes_.reserve(pieces.size());
    for (const Tensor& piece : pieces) shapes_.push_back(piece.sizes());
  }
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override {
    if (std::optional<Tensor> joined = side_by_side(grads)) return {*joined};
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = ops::zeros(shapes_[i], {.dtype = dtype_, .device = device_});
    }
    return {ops::cat(grads, dim_)};
  }

 private:
  // The gradients as one view when they already lie side by side along dim
  // in one buffer, in the input's dtype (attention writes q, k and v's so
  // for a packed projection): the join costs no copy. The engine adds into
  // a gradient in place only while nothing else holds its storage.
  std::optional<Tensor> side_by_side(const TensorList& grads) const {
    if (grads.empty() || !grads[0].defined()) return std::nullopt;
    const Tensor& first = grads[0];
    int64_t offset = first.storage_offset(), along = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const Tensor& grad = grads[i];
      if (!grad.defined() || grad.storage() != first.storage() || grad.dtype() != dtype_ ||
          grad.sizes() != shapes_[i] || grad.strides() != first.strides() || grad.storage_offset() != offset) {
        return std::nullopt;
      }
      offset += shapes_[i][dim_] * first.stride(dim_);
      along += shapes_[i][dim_];
    }
    Shape joined = shapes_[0];
    joined[dim_] = along;
    return Tensor::make(first.storage(), joined, first.strides(), first.storage_offset(), dtype_);
  }

  const char* name_;
  int64_t dim_;
  DType dtype_;
  Device device_;
  std::vector<Shape> shapes_;
};

class IndexSelectBackward final : public Node {
 public:
  IndexSelectBackward(const Tensor& input, int64_t dim, Tensor index)
      : shape_(input.sizes()), dtype_(input.dtype()), device_(input.device()), dim_(dim), index_(std::move(index)) {}
  std::string name() const override { return "IndexSelectBackward"; }
  TensorList apply(TensorList&& grads) override {
    // Rows picked several times get the sum of their gradients.
    Tensor grad_input = ops::zeros(shape_, {.dtype = dtype_, .device = device_});
    ops::index_add_(grad_input, dim_, index_, grads[0]);
    return {grad_input};
  }
  void release_saved_tensors() override { index_ = Tensor(); }

 private:
  Shape shape_;
  DType dtype_;
  Device device_;
  int64_t dim_;
  Tensor index_;
};

std::vector<Tensor> record_split(std::vector<Tensor> pieces, const Tensor& x, int64_t dim, const char* name) {
  if (!autograd::any_requires_grad({&x})) return pieces;
  auto node = std::make_shared<SplitBackward>(name, wrap_dim(dim, x.dim(), name), pieces, x);
  node->set_next_edges(autograd::collect_edges({&x}));
  node->set_num_outputs(static_cast<uint32_t>(pieces.size()));
  for (uint32_t i = 0; i < pieces.size(); ++i) autograd::set_history(pieces[i], node, i);
  return pieces;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::cat(tensors, dim);
  if (!autograd::any_requires_grad(tensors)) return y;
  auto node = std::make_shared<CatBackward>(wrap_dim(dim, y.dim(), "cat"), tensors);
  node->set_next_edges(autograd::collect_edges(tensors));
  autograd::set_history(y, node);
  return y;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::stack(tensors, dim);
  if (!autograd::any_requires_grad(tensors)) return y;
  auto node = std::make_shared<StackBackward>(wrap_dim(dim, y.dim(), "stack"), tensors);
  node->set_next_edges(autograd::collect_edges(tensors));
  autograd::set_history(y, node);
  return y;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const GradInputsAllowed recorded_here;
  return record_split(ops::split(x, split_size, dim), x, dim, "SplitBackward");
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const GradInputsAllowed recorded_here;
  return record_split(ops::chunk(x, chunks, dim), x, dim, "ChunkBackward");
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::index_select(x, dim, index);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(y, std::make_shared<IndexSelectBackward>(x, wrap_dim(dim, x.dim(), "index_select"), index), {&x});
  }
  return y;
}

}  // namespace tessera
