#include "tensor/cuda/operands.h"

#include "tensor/error.h"
#include "tensor/stream.h"

namespace tessera::cuda {

Operand operand(const Tensor& tensor) {
  TESSERA_CHECK(tensor.dim() <= kMaxDims, "cuda: a tensor of {} dims (shape {}); cuda kernels take up to {}",
                tensor.dim(), tensor.sizes(), kMaxDims);
  Operand result;
  result.data = tensor.numel() == 0 ? nullptr : tensor.cuda_data();
  result.dtype = tensor.dtype();
  result.count = tensor.numel();
  result.contiguous = tensor.is_contiguous();
  result.layout.dims = static_cast<int32_t>(tensor.dim());
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) {
    result.layout.sizes[dim] = tensor.sizes()[dim];
    result.layout.strides[dim] = tensor.strides()[dim];
  }
  return result;
}

BufferUse buffer_use(const char* role, const Tensor& tensor, BufferAccess access) {
  // The bytes between the first and the last element the view reaches.
  int64_t last = 0;
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) {
    TESSERA_CHECK(tensor.strides()[dim] >= 0, "cuda: negative stride in shape {} strides {}", tensor.sizes(),
                  tensor.strides());
    last += (tensor.sizes()[dim] - 1) * tensor.strides()[dim];
  }
  const int64_t bytes = tensor.numel() == 0 ? 0 : (last + 1) * static_cast<int64_t>(tensor.element_size());
  return BufferUse{fmt::format("{} {}{}", role, dtype_name(tensor.dtype()), tensor.sizes()),
                   tensor.numel() == 0 ? nullptr : tensor.cuda_data(), bytes, access};
}

KernelLaunch launch_on_current_stream(Device device, std::vector<BufferUse> buffers) {
  return KernelLaunch{current_stream(device).get(), std::move(buffers)};
}

}  // namespace tessera::cuda
