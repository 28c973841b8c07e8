// Gather and scatter-add along one dim (index_select, index_add_): the ops
// behind embedding and its backward. Every index is range-checked here, so
// kernels may trust them; kernels receive contiguous inputs.
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/raw_op_guard.h"

namespace tessera::ops {

namespace {

// index: 1-d i32/i64 on `device`, every value in [0, size).
void check_index(const Tensor& index, int64_t size, int64_t dim, const Tensor& tensor, Device device, const char* op) {
  TESSERA_CHECK(index.defined(), "{}: index is an undefined tensor", op);
  TESSERA_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, "{}: index must be i32 or i64, got {}", op,
                dtype_name(index.dtype()));
  TESSERA_CHECK(index.dim() == 1, "{}: index must be 1-d, got shape {}", op, index.sizes());
  TESSERA_CHECK(index.device() == device, "{}: index is on {}, the tensor on {}", op, index.device().str(),
                device.str());
  if (index.is_meta() || index.numel() == 0) return;
  kernels(device).check_index_range(index, size, std::nullopt, [op, dim, size, shape = tensor.sizes()](
                                                                     int64_t position, int64_t value) {
    return fmt::format("{}: index {} at position {} is out of range for dim {} of size {} (shape {})", op, value,
                       position, dim, size, shape);
  });
}

}  // namespace

Tensor index_select(const Tensor& tensor, int64_t dim, const Tensor& index) {
  check_raw_op_inputs("index_select", {{"tensor", tensor}});
  TESSERA_CHECK(tensor.defined(), "index_select: undefined tensor");
  TESSERA_CHECK(tensor.dim() > 0, "index_select: cannot index a 0-d tensor");
  const int64_t d = wrap_dim(dim, tensor.dim(), "index_select");
  check_index(index, tensor.sizes()[d], d, tensor, tensor.device(), "index_select");
  Shape shape = tensor.sizes();
  shape[d] = index.numel();
  Tensor out = empty(shape, {.dtype = tensor.dtype(), .device = tensor.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  kernels(out.device()).index_select(out, contiguous(tensor), d, contiguous(index));
  return out;
}

void index_add_(Tensor& out, int64_t dim, const Tensor& index, const Tensor& source) {
  check_raw_op_inputs("index_add_", {{"source", source}});
  const GradInputsAllowed out_is_only_written;  // in place: the sources are checked, not out (see ops.h)
  TESSERA_CHECK(out.defined() && source.defined(), "index_add_: undefined tensor");
  TESSERA_CHECK(out.dim() > 0, "index_add_: cannot index a 0-d tensor");
  const int64_t d = wrap_dim(dim, out.dim(), "index_add_");
  TESSERA_CHECK(out.dtype() == source.dtype(), "index_add_: source dtype {} differs from out dtype {}",
                dtype_name(source.dtype()), dtype_name(out.dtype()));
  TESSERA_CHECK(out.dtype() != DType::boolean, "index_add_: bool tensors cannot be added to");
  TESSERA_CHECK(source.device() == out.device(), "index_add_: source is on {}, out on {}", source.device().str(),
                out.device().str());
  check_index(index, out.sizes()[d], d, out, out.device(), "index_add_");
  // source: out's shape with index.numel() along dim.
  Shape expected = out.sizes();
  expected[d] = index.numel();
  TESSERA_CHECK(source.sizes() == expected,
                "index_add_: source shape {} should be {} (out shape {} with {} indices along dim {})", source.sizes(),
                expected, out.sizes(), index.numel(), d);
  if (out.is_meta() || source.numel() == 0) return;

  // Accumulate in the compute dtype (f32 for bf16/f16) in a contiguous buffer,
  // then write back once when out itself could not take the kernel.
  const DType compute = compute_dtype(out.dtype());
  const bool direct = out.is_contiguous() && compute == out.dtype();
  const Tensor accumulator = direct ? out : contiguous(to(out, compute));
  Tensor addend = contiguous(to(source, compute));
  if (addend.shares_storage_with(accumulator)) addend = clone(addend);  // source aliases out: read a snapshot
  kernels(out.device()).index_add(accumulator, d, contiguous(index), addend);
  if (!direct) copy_(out, accumulator);
}

}  // namespace tessera::ops
