// Tensor handle accessors and geometry helpers.
#include "tensor/tensor.h"

#include <algorithm>
#include <limits>

namespace tessera {

int64_t shape_numel(const Shape& shape) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  return numel;
}

// Only an empty tensor can have extents whose product overflows (a
// safetensors file may declare [0, 2^50, 2^50]); its strides saturate at
// INT64_MAX, since nothing is ever addressed through them.
Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride)) {
      stride = std::numeric_limits<int64_t>::max();
    }
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t rank = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  TESSERA_CHECK(dim >= -rank && dim < rank, "{}: dim {} out of range for a {}-d tensor", op, dim, ndim);
  return dim < 0 ? dim + rank : dim;
}

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage_, Shape shape_, Shape strides_, int64_t offset_,
                       DType dtype_)
    : storage(std::move(storage_)), shape(std::move(shape_)), strides(std::move(strides_)), offset(offset_),
      dtype(dtype_) {}

Tensor Tensor::make(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype) {
  TESSERA_CHECK(storage != nullptr, "Tensor::make: null storage");
  TESSERA_CHECK(shape.size() == strides.size(), "Tensor::make: shape {} and strides {} differ in rank", shape,
                strides);
  for (int64_t size : shape) TESSERA_CHECK(size >= 0, "Tensor::make: negative size in shape {}", shape);
  if (!storage->device().is_meta() && shape_numel(shape) > 0) {
    int64_t last = offset;
    for (size_t i = 0; i < shape.size(); ++i) {
      TESSERA_CHECK(strides[i] >= 0, "Tensor::make: negative stride in {}", strides);
      last += (shape[i] - 1) * strides[i];
    }
    const int64_t capacity = storage->bytes() / static_cast<int64_t>(tessera::element_size(dtype));
    TESSERA_CHECK(offset >= 0 && last < capacity,
                  "Tensor::make: view shape {} strides {} offset {} reaches element {} of a storage holding {}",
                  shape, strides, offset, last, capacity);
  }
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), std::move(shape), std::move(strides), offset, dtype));
}

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  TESSERA_CHECK(impl != nullptr, "use of an undefined tensor");
  return *impl;
}
}  // namespace

const Shape& Tensor::sizes() const { return checked(impl_).shape; }
int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::numel() const { return shape_numel(sizes()); }
int64_t Tensor::storage_offset() const { return checked(impl_).offset; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

bool Tensor::is_contiguous() const {
  const auto& impl = checked(impl_);
  if (shape_numel(impl.shape) == 0) return true;  // no element to be out of place
  int64_t expected = 1;
  for (size_t i = impl.shape.size(); i-- > 0;) {
    if (impl.shape[i] == 1) continue;
    if (impl.strides[i] != expected) return false;
    expected *= impl.shape[i];
  }
  return true;
}

void Tensor::check_data_access(DType expected, const char* what) const {
  const auto& impl = checked(impl_);
  TESSERA_CHECK(!impl.storage->device().is_meta(),
                "{}: tensor of shape {} is on the meta device and has no data (materialise it with to_empty)", what,
                impl.shape);
  TESSERA_CHECK(impl.storage->device().is_cpu(), "{}: tensor is on {}; copy it to cpu first", what,
                impl.storage->device().str());
  TESSERA_CHECK(impl.dtype == expected, "{}: tensor has dtype {}, asked for {}", what, dtype_name(impl.dtype),
                dtype_name(expected));
}

namespace {

// The address of `impl`'s first element; `what` names the accessor in errors.
void* first_element(const TensorImpl& impl, const char* what) {
  TESSERA_CHECK(!impl.storage->is_released(),
                "{}: tensor of shape {} has had its storage released (an FSDP parameter read while resharded?)", what,
                impl.shape);
  return static_cast<char*>(impl.storage->data()) + impl.offset * static_cast<int64_t>(element_size(impl.dtype));
}

}  // namespace

void* Tensor::raw_data() const {
  const auto& impl = checked(impl_);
  const Device device = impl.storage->device();
  TESSERA_CHECK(!device.is_meta(),
                "raw_data: tensor of shape {} is on the meta device and has no data (materialise it with to_empty)",
                impl.shape);
  TESSERA_CHECK(!device.is_cuda(),
                "raw_data: tensor of shape {} is on {}: its bytes are device memory, which host code never reads; "
                "copy it to cpu first (ops::to)",
                impl.shape, device.str());
  return first_element(impl, "raw_data");
}

void* Tensor::cuda_data() const {
  const auto& impl = checked(impl_);
  TESSERA_CHECK(impl.storage->device().is_cuda(), "cuda_data: tensor of shape {} is on {}, not cuda", impl.shape,
                impl.storage->device().str());
  return first_element(impl, "cuda_data");
}

Tensor Tensor::detach() const {
  const auto& impl = checked(impl_);
  return Tensor(std::make_shared<TensorImpl>(impl.storage, impl.shape, impl.strides, impl.offset, impl.dtype));
}

AutogradMeta& Tensor::autograd_meta() const {
  auto& impl = const_cast<TensorImpl&>(checked(impl_));
  if (!impl.autograd) impl.autograd = std::make_unique<AutogradMeta>();
  return *impl.autograd;
}

bool Tensor::requires_grad() const {
  const auto& impl = checked(impl_);
  return impl.autograd && (impl.autograd->requires_grad || impl.autograd->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  TESSERA_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad (this one has a grad_fn)");
  TESSERA_CHECK(!requires_grad || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, got {}",
                dtype_name(dtype()));
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  const auto& impl = checked(impl_);
  return impl.autograd ? impl.autograd->grad : undefined;
}

Tensor& Tensor::mutable_grad() { return autograd_meta().grad; }

void Tensor::set_grad(Tensor grad) {
  if (grad.defined()) {
    TESSERA_CHECK(grad.sizes() == sizes(), "set_grad: grad shape {} differs from tensor shape {}", grad.sizes(), sizes());
  }
  autograd_meta().grad = std::move(grad);
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  const auto& impl = checked(impl_);
  return impl.autograd ? impl.autograd->grad_fn : none;
}

uint32_t Tensor::output_nr() const {
  const auto& impl = checked(impl_);
  return impl.autograd ? impl.autograd->output_nr : 0;
}

}  // namespace tessera
