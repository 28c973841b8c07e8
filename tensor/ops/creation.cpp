// Creation ops: fresh contiguous tensors, constant, ranged, from host values or
// from the Philox sequences. Random fills are indexed by logical position, so
// a shard (first_index > 0) draws exactly the values the whole tensor has there.
#include <cmath>
#include <cstring>

#include "tensor/kernels.h"
#include "tensor/ops.h"

namespace tessera::ops {

namespace {

// numel of `shape`, checking that every size is >= 0 and the byte count fits.
int64_t checked_numel(const Shape& shape, DType dtype, const char* op) {
  int64_t numel = 1;
  for (int64_t size : shape) {
    TESSERA_CHECK(size >= 0, "{}: negative size in shape {}", op, shape);
    TESSERA_CHECK(!__builtin_mul_overflow(numel, size, &numel), "{}: shape {} has too many elements", op, shape);
  }
  int64_t bytes = 0;
  TESSERA_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(element_size(dtype)), &bytes),
                "{}: shape {} of {} is too large", op, shape, dtype_name(dtype));
  return numel;
}

void check_floating(DType dtype, const char* op) {
  TESSERA_CHECK(is_floating(dtype), "{}: needs a floating dtype, got {}", op, dtype_name(dtype));
  TESSERA_CHECK(element_size(dtype) > 1, "{}: {} has too few values for random draws; draw in f32 and cast", op,
                dtype_name(dtype));
}

// Fills `out` with elements [first_index, first_index + numel) of the sequence
// in logical order; the kernel writes contiguous tensors, so strided ones go
// through a contiguous buffer.
void fill_random(Tensor& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
                 uint64_t first_index) {
  if (out.is_meta() || out.numel() == 0) return;
  if (out.is_contiguous()) {
    kernels(out.device()).random(out, distribution, key, a, b, first_index);
    return;
  }
  Tensor buffer = empty(out.sizes(), {.dtype = out.dtype(), .device = out.device()});
  kernels(out.device()).random(buffer, distribution, key, a, b, first_index);
  copy_(out, buffer);
}

template <typename T>
Tensor from_host(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
  const int64_t numel = checked_numel(shape, options.dtype, "from_vector");
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == numel,
                "from_vector: {} values do not fill shape {} ({} elements)", values.size(), shape, numel);
  Tensor out = empty(shape, {.dtype = options.dtype, .device = options.device});
  if (!out.is_meta() && numel > 0) {
    Tensor host = out;
    if (!out.device().is_cpu() || out.dtype() != dtype_of<T>::value) {
      host = empty(shape, {.dtype = dtype_of<T>::value, .device = kCPU});
    }
    std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
    if (!host.is_same(out)) copy_(out, host);
  }
  if (options.requires_grad) out.set_requires_grad(true);
  return out;
}

}  // namespace

Tensor empty(const Shape& shape, TensorOptions options) {
  const int64_t numel = checked_numel(shape, options.dtype, "empty");
  auto storage = allocate(options.device, numel * static_cast<int64_t>(element_size(options.dtype)));
  Tensor out = Tensor::make(std::move(storage), shape, contiguous_strides(shape), 0, options.dtype);
  if (options.requires_grad) out.set_requires_grad(true);
  return out;
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }

Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor out = empty(shape, options);
  fill_(out, value);
  return out;
}

Tensor empty_like(const Tensor& like) {
  TESSERA_CHECK(like.defined(), "empty_like: undefined tensor");
  return empty(like.sizes(), {.dtype = like.dtype(), .device = like.device()});
}

Tensor zeros_like(const Tensor& like) { return full_like(like, 0.0); }

Tensor ones_like(const Tensor& like) { return full_like(like, 1.0); }

Tensor full_like(const Tensor& like, double value) {
  Tensor out = empty_like(like);
  fill_(out, value);
  return out;
}

Tensor arange(double start, double end, double step, TensorOptions options) {
  TESSERA_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
                "arange: start {}, end {} and step {} must be finite", start, end, step);
  TESSERA_CHECK(step != 0.0, "arange: step must be nonzero");
  TESSERA_CHECK((end - start) * step >= 0.0, "arange: step {} does not lead from {} to {}", step, start, end);
  const double count = std::ceil((end - start) / step);
  TESSERA_CHECK(count < 9.0e18, "arange: [{}, {}) in steps of {} has too many elements", start, end, step);
  Tensor out = empty({static_cast<int64_t>(count)}, options);
  if (out.is_meta() || out.numel() == 0) return out;
  kernels(out.device()).arange(out, start, step);
  return out;
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, TensorOptions options) {
  return from_host(values, shape, options);
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions options) {
  return from_host(values, shape, options);
}

Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, TensorOptions options) {
  return from_host(values, shape, options);
}

Tensor from_vector(const std::vector<uint8_t>& values, const Shape& shape, TensorOptions options) {
  return from_host(values, shape, options);
}

Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

namespace {
// A new tensor holding the first numel values of the standard sequence `key`.
Tensor random_tensor(const char* op, RandomDistribution distribution, const Shape& shape, PhiloxKey key,
                     TensorOptions options) {
  check_floating(options.dtype, op);
  Tensor out = empty(shape, {.dtype = options.dtype, .device = options.device});
  fill_random(out, distribution, key, 0.0, 1.0, 0);
  if (options.requires_grad) out.set_requires_grad(true);
  return out;
}
}  // namespace

Tensor rand(const Shape& shape, PhiloxKey key, TensorOptions options) {
  return random_tensor("rand", RandomDistribution::uniform, shape, key, options);
}

Tensor randn(const Shape& shape, PhiloxKey key, TensorOptions options) {
  return random_tensor("randn", RandomDistribution::normal, shape, key, options);
}

Tensor rand(const Shape& shape, TensorOptions options) { return rand(shape, default_generator().next_key(), options); }

Tensor randn(const Shape& shape, TensorOptions options) {
  return randn(shape, default_generator().next_key(), options);
}

void uniform_(Tensor& out, PhiloxKey key, double low, double high, uint64_t first_index) {
  TESSERA_CHECK(out.defined(), "uniform_: undefined tensor");
  check_floating(out.dtype(), "uniform_");
  TESSERA_CHECK(low <= high, "uniform_: low {} is above high {}", low, high);
  fill_random(out, RandomDistribution::uniform, key, low, high, first_index);
}

void normal_(Tensor& out, PhiloxKey key, double mean, double std, uint64_t first_index) {
  TESSERA_CHECK(out.defined(), "normal_: undefined tensor");
  check_floating(out.dtype(), "normal_");
  TESSERA_CHECK(std >= 0.0, "normal_: std must be >= 0, got {}", std);
  fill_random(out, RandomDistribution::normal, key, mean, std, first_index);
}

}  // namespace tessera::ops
