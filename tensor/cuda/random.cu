// Random numbers on the device: the same Philox 4x32-10 code as the cpu
// (tensor/philox.h), the same mapping to a distribution, so a shard filled
// on the GPU holds the cpu's bits at every index. Uniform values are exact
// in any case (24 random bits); normal ones go through log and cos in f64,
// which the simulator computes with the cpu's library.
#include "tensor/cuda/random.h"

#include <cmath>
#include <limits>

#include "tensor/cuda/kernel_loop.h"
#include "tensor/element_conversion.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) random_kernel(T* out, Layout layout, bool dense, int64_t count, bool normal,
                                                        PhiloxKey key, double a, double b, uint64_t first) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const uint64_t index = first + static_cast<uint64_t>(i);
    T value;
    if (normal) {
      value = convert<T>(a + b * philox_normal(key, index));
    } else {
      value = convert<T>(a + (b - a) * static_cast<double>(philox_uniform(key, index)));
      // Rounding to T may reach b; the range is half-open.
      while (a < b && convert<double>(value) >= b) value = step_down(value);
    }
    out[dense ? i : layout.offset(i)] = value;
  }
}

}  // namespace

void random(const Operand& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
            uint64_t first_index, const KernelLaunch& launch) {
  const bool normal = distribution == RandomDistribution::normal;
  visit_dtype(out.dtype, [&]<typename T>(T) {
    if constexpr (std::is_floating_point_v<T> || is_16_bit_float<T>) {
      TESSERA_LAUNCH(random_kernel<T>, config_for(out.count, launch), static_cast<T*>(out.data), out.layout,
                     out.contiguous, out.count, normal, key, a, b, first_index);
    } else {
      refuse_operands("random", "needs a floating output, got", out.dtype);
    }
  });
}

}  // namespace tessera::cuda
