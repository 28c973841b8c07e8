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
  const Operand view = operand(tensor);
  return BufferUse{fmt::format("{} {}{}", role, dtype_name(tensor.dtype()), tensor.sizes()),
                   tensor.numel() == 0 ? nullptr : tensor.cuda_data(), bytes, access,
                   StridedElements::of(static_cast<int64_t>(tensor.element_size()), view.layout.dims,
                                       view.layout.sizes, view.layout.strides)};
}

StridedElements StridedElements::of(int64_t element_bytes, int32_t dims, const int64_t* sizes,
                                    const int64_t* strides) {
  TESSERA_CHECK(dims >= 0 && dims <= kMaxDims, "StridedElements::of: {} dims; a view has 0 to {}", dims, kMaxDims);
  // The dims that add elements, by decreasing stride, each inserted in its
  // place as it comes: at most kMaxDims of them. (std::sort made GCC 12 warn,
  // -Warray-bounds, of its path for more than 16 elements, which cannot run.)
  StridedElements sorted;
  int64_t count = 1;
  for (int32_t dim = 0; dim < dims; ++dim) {
    if (sizes[dim] == 0) return StridedElements{};
    if (sizes[dim] == 1 || strides[dim] == 0) continue;  // neither adds elements to the set
    count *= sizes[dim];
    int32_t at = sorted.dims++;
    for (; at > 0 && sorted.strides[at - 1] < strides[dim]; --at) {
      sorted.sizes[at] = sorted.sizes[at - 1];
      sorted.strides[at] = sorted.strides[at - 1];
    }
    sorted.sizes[at] = sizes[dim];
    sorted.strides[at] = strides[dim];
  }
  // A stride at or below the reach of the dims after it is not nested.
  int64_t reach = 0;  // the largest offset the dims after this one reach
  for (int32_t dim = sorted.dims - 1; dim >= 0; --dim) {
    if (sorted.strides[dim] <= reach) return StridedElements{};
    reach += (sorted.sizes[dim] - 1) * sorted.strides[dim];
  }
  if (reach + 1 == count) return StridedElements{};  // dense: the span is the elements
  sorted.element_bytes = static_cast<int32_t>(element_bytes);
  return sorted;
}

KernelLaunch launch_on_current_stream(Device device, std::vector<BufferUse> buffers) {
  return KernelLaunch{current_stream(device).get(), std::move(buffers)};
}

}  // namespace tessera::cuda
