// The cuda kernel table: each entry declares the bytes its launch reads and
// writes (for the simulator's memcheck and stream-ordering checker) and runs
// on the current stream of the tensors' device. Entries whose kernels are
// not written yet refuse with an error naming the op.
#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/operands.h"
#include "tensor/cuda/transfer.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

namespace tessera::cuda {

namespace {

constexpr BufferAccess kRead = BufferAccess::read;
constexpr BufferAccess kWrite = BufferAccess::write;

[[noreturn]] void not_on_cuda_yet(const char* op) {
  fail("{} has no cuda kernel yet (the cuda device is being built: elementwise ops, copies and fills run on it "
       "today); compute it on cpu",
       op);
}

void fill_kernel(const Tensor& out, double value) {
  fill(operand(out), value, launch_on_current_stream(out.device(), {buffer_use("out", out, kWrite)}));
}

void copy_kernel(const Tensor& dst, const Tensor& src) {
  if (src.device().is_cpu()) return copy_host_to_device(dst, src);
  if (dst.device().is_cpu()) return copy_device_to_host(dst, src);
  TESSERA_CHECK(src.device() == dst.device(), "copy: between {} and {}; copy through the host", src.device().str(),
                dst.device().str());
  copy(operand(dst), operand(src),
       launch_on_current_stream(dst.device(), {buffer_use("in", src, kRead), buffer_use("out", dst, kWrite)}));
}

void arange_kernel(const Tensor& out, double start, double step) {
  arange(operand(out), start, step, launch_on_current_stream(out.device(), {buffer_use("out", out, kWrite)}));
}

void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x) {
  unary(op, operand(out), operand(x),
        launch_on_current_stream(out.device(), {buffer_use("x", x, kRead), buffer_use("out", out, kWrite)}));
}

void unary_backward_kernel(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved) {
  unary_backward(op, operand(grad_in), operand(grad_out), operand(saved),
                 launch_on_current_stream(grad_in.device(),
                                          {buffer_use("grad_out", grad_out, kRead), buffer_use("saved", saved, kRead),
                                           buffer_use("grad_in", grad_in, kWrite)}));
}

void binary_kernel(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  binary(op, operand(out), operand(a), operand(b),
         launch_on_current_stream(out.device(), {buffer_use("a", a, kRead), buffer_use("b", b, kRead),
                                                 buffer_use("out", out, kWrite)}));
}

void where_kernel(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  where(operand(out), operand(condition), operand(a), operand(b),
        launch_on_current_stream(out.device(), {buffer_use("condition", condition, kRead), buffer_use("a", a, kRead),
                                                buffer_use("b", b, kRead), buffer_use("out", out, kWrite)}));
}

}  // namespace

void refuse_operands(const char* kernel, const char* what, DType dtype) {
  fail("cuda::{}: {} {}", kernel, what, dtype_name(dtype));
}

const KernelTable& kernel_table() {
  static const KernelTable table{
      .fill = fill_kernel,
      .copy = copy_kernel,
      .arange = arange_kernel,
      .random = [](const Tensor&, RandomDistribution, PhiloxKey, double, double, uint64_t) { not_on_cuda_yet("random"); },
      .unary = unary_kernel,
      .unary_backward = unary_backward_kernel,
      .binary = binary_kernel,
      .where = where_kernel,
      .reduce = [](ReduceOp, const Tensor&, const Tensor&, const std::vector<bool>&) { not_on_cuda_yet("reduce"); },
      .max_along = [](const Tensor&, const Tensor&, const Tensor&, int64_t) { not_on_cuda_yet("max_along"); },
      .index_select = [](const Tensor&, const Tensor&, int64_t, const Tensor&) { not_on_cuda_yet("index_select"); },
      .index_add = [](const Tensor&, int64_t, const Tensor&, const Tensor&) { not_on_cuda_yet("index_add"); },
      .matmul = [](const Tensor&, const Tensor&, const Tensor&) { not_on_cuda_yet("matmul"); },
      .softmax = [](const Tensor&, const Tensor&, bool) { not_on_cuda_yet("softmax"); },
      .softmax_backward = [](const Tensor&, const Tensor&, const Tensor&, bool) { not_on_cuda_yet("softmax"); },
      .norm = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 double) { not_on_cuda_yet("layer_norm/rms_norm"); },
      .norm_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&) { not_on_cuda_yet("layer_norm/rms_norm"); },
      .cross_entropy = [](const Tensor&, const Tensor&, const Tensor&, int64_t) { not_on_cuda_yet("cross_entropy"); },
      .cross_entropy_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   int64_t) { not_on_cuda_yet("cross_entropy"); },
      .causal_attention = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) { not_on_cuda_yet("causal_attention"); },
      .causal_attention_backward = [](const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&) { not_on_cuda_yet("causal_attention"); },
      .dropout = [](const Tensor&, const Tensor&, const Tensor&, double, PhiloxKey) { not_on_cuda_yet("dropout"); },
  };
  return table;
}

}  // namespace tessera::cuda
