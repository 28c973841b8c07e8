// The fused cross-entropy on the device: softmax, loss and gradient over the
// classes without materialising the probabilities.
//   forward:  a group of threads per row reads the logits once, keeping a
//             running maximum and the sum of exp(x - max) (the online
//             softmax: the maximum keeps exp in range), and writes the row's
//             logsumexp and loss; one block then takes the mean over kept
//             rows with a fixed tree in f64 (the loss stays on the device).
//   backward: one block counts the kept rows for grad_loss / kept, then a
//             block per row writes scale (exp(x - logsumexp) - onehot): the
//             logits read once, the gradient written once.
// Rows whose pitch is a multiple of 8 columns move in chunks of 8 (16-byte
// loads of bf16), others one value at a time. The forward takes a chunk's
// values at once: its maximum first (the running sum rescaled at most once),
// then 8 exps with no branch between them (a value at a time was ~22
// instructions, a compare and branch and sometimes a second exp; ~14 now).
// Arithmetic in f32 for f32 and bf16 logits, f64 for f64; ignored rows (the
// target equals ignore_index) add nothing and get a zero gradient, as on the
// cpu (tensor/cpu/normalization.cpp).
#include "tensor/cuda/cross_entropy.h"

#include <cstdint>

#include "tensor/cuda/portability.h"
#include "tensor/cuda/row_group.h"

namespace tessera::cuda {

namespace {

// Columns a thread takes at once in the packed loops: 16 bytes of bf16, 32
// of f32 (two 16-byte loads). The same count for every dtype, so bf16 rows
// and their f32 widening sum in the same order (the same bits).
constexpr int kChunk = 8;

// The running maximum and sum of exp(x - max) over a thread's columns of one
// row of logits: chunks of kChunk columns (a thread's p-th chunk is columns
// [8p, 8p + 8)) when every row starts on a chunk's boundary, as a padded
// vocabulary makes them, else single values (column first + i * kStride).
// With chunks a thread has 16 or 32 bytes in flight per load instead of 2 or
// 4 (single bf16 loads left the kernel bound by load latency, 0.9 TB/s on an
// H100, ncu), and takes a chunk's values at once (MaxSum::add_chunk). The
// last chunk may reach into the padding, which it reads as -inf: exp gives 0
// for it, exactly, and the maximum ignores it.
template <bool kPacked, int kStride, typename T>
__device__ MaxSum<Accumulator<T>> row_max_sum(const T* row, int64_t classes, int first) {
  using A = Accumulator<T>;
  MaxSum<A> state = MaxSum<A>::none();
  if constexpr (kPacked) {
    using P = Pack<T, kChunk>;
    const P* packs = reinterpret_cast<const P*>(row);
    const int64_t pack_count = (classes + P::kCount - 1) / P::kCount;
#pragma unroll 1
    for (int64_t p = first; p < pack_count; p += kStride) {
      const P pack = packs[p];
      A values[P::kCount];
#pragma unroll
      for (int j = 0; j < P::kCount; ++j) values[j] = convert<A>(pack.values[j]);
      if ((p + 1) * P::kCount > classes) {
#pragma unroll
        for (int j = 0; j < P::kCount; ++j) {
          if (p * P::kCount + j >= classes) values[j] = -std::numeric_limits<A>::infinity();
        }
      }
      state.add_chunk(values);
    }
  } else {
#pragma unroll 1  // unrolled, f64 exp's slow paths spill
    for (int64_t col = first; col < classes; col += kStride) state.add(convert<A>(row[col]));
  }
  return state;
}

template <typename T, typename Index, int kGroupThreads, bool kPacked>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads)
    cross_entropy_rows_kernel(Accumulator<T>* row_losses, Accumulator<T>* logsumexp, const T* logits,
                              const Index* targets, int64_t rows, int64_t classes, int64_t columns,
                              int64_t ignore_index) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  const int lane = Group::lane();
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    const T* x = logits + row * columns;
    const MaxSum<A> state = Group::all_reduce(row_max_sum<kPacked, kGroupThreads>(x, classes, lane), Combine{});
    if (lane != 0) continue;
    const A row_logsumexp = state.max + std::log(state.sum);
    logsumexp[row] = row_logsumexp;
    const auto target = static_cast<int64_t>(targets[row]);
    // A target out of range (check_index_range reports it) reads nothing.
    const bool readable = target >= 0 && target < classes;
    row_losses[row] = target == ignore_index || !readable ? A(0) : row_logsumexp - convert<A>(x[target]);
  }
}

// loss = (sum of the kept rows' losses) / kept, in f64; NaN with no kept row
// (0/0, as torch's mean gives).
template <typename Loss, typename Index>
__global__ void __launch_bounds__(kThreads) cross_entropy_mean_kernel(Loss* loss, const Loss* row_losses,
                                                                      const Index* targets, int64_t rows,
                                                                      int64_t ignore_index) {
  __shared__ double sums[kThreads];
  __shared__ int64_t counts[kThreads];
  double sum = 0;
  int64_t kept = 0;
  for (int64_t row = threadIdx.x; row < rows; row += kThreads) {
    if (static_cast<int64_t>(targets[row]) == ignore_index) continue;
    sum += static_cast<double>(row_losses[row]);
    ++kept;
  }
  sums[threadIdx.x] = sum;
  counts[threadIdx.x] = kept;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      sums[threadIdx.x] += sums[threadIdx.x + stride];
      counts[threadIdx.x] += counts[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  loss[0] = static_cast<Loss>(counts[0] > 0 ? sums[0] / static_cast<double>(counts[0])
                                            : std::numeric_limits<double>::quiet_NaN());
}

// scale = grad_loss / kept (0 with no kept row), rounded once as on the cpu.
template <typename A, typename Index>
__global__ void __launch_bounds__(kThreads) cross_entropy_scale_kernel(A* scale, const A* grad_loss,
                                                                       const Index* targets, int64_t rows,
                                                                       int64_t ignore_index) {
  __shared__ int64_t counts[kThreads];
  int64_t kept = 0;
  for (int64_t row = threadIdx.x; row < rows; row += kThreads) {
    kept += static_cast<int64_t>(targets[row]) != ignore_index ? 1 : 0;
  }
  counts[threadIdx.x] = kept;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) counts[threadIdx.x] += counts[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  scale[0] = counts[0] > 0 ? static_cast<A>(static_cast<double>(grad_loss[0]) / static_cast<double>(counts[0])) : A(0);
}

template <typename T, typename Index, bool kPacked>
__global__ void __launch_bounds__(kThreads) cross_entropy_backward_kernel(T* grad_logits, const Accumulator<T>* scale,
                                                                          const T* logits,
                                                                          const Accumulator<T>* logsumexp,
                                                                          const Index* targets, int64_t rows,
                                                                          int64_t classes, int64_t columns,
                                                                          int64_t ignore_index) {
  using A = Accumulator<T>;
  // One load per block or row, shared, rather than one per thread.
  __shared__ A block_scale, row_logsumexp;
  __shared__ int64_t row_target;
  if (threadIdx.x == 0) block_scale = *scale;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    __syncthreads();  // the previous row's readers are done
    if (threadIdx.x == 0) {
      const auto target = static_cast<int64_t>(targets[row]);
      row_target = target == ignore_index ? -1 : target;
      row_logsumexp = target == ignore_index ? A(0) : logsumexp[row];
    }
    __syncthreads();
    const A s = block_scale, lse = row_logsumexp;
    const int64_t target = row_target;
    const T* x = logits + row * columns;
    T* grad = grad_logits + row * columns;
    // An ignored row's or a padding column's gradient is zero, its logits unread.
    const auto gradient = [&](int64_t col, T logit) {
      A value = std::exp(convert<A>(logit) - lse) * s;
      if (col == target) value -= s;
      return convert<T>(value);
    };
    if constexpr (kPacked) {  // chunked loads and stores, as in row_max_sum
      using P = Pack<T, kChunk>;
      const P* in = reinterpret_cast<const P*>(x);
      P* out = reinterpret_cast<P*>(grad);
#pragma unroll 1
      for (int64_t p = threadIdx.x; p < columns / P::kCount; p += kThreads) {
        P pack;
        if (target >= 0 && p * P::kCount < classes) {
          const P logits_pack = in[p];
#pragma unroll
          for (int j = 0; j < P::kCount; ++j) {
            const int64_t col = p * P::kCount + j;
            pack.values[j] = col < classes ? gradient(col, logits_pack.values[j]) : convert<T>(A(0));
          }
        } else {
#pragma unroll
          for (int j = 0; j < P::kCount; ++j) pack.values[j] = convert<T>(A(0));
        }
        out[p] = pack;
      }
    } else {
#pragma unroll 1  // unrolled, f64 exp's slow paths spill
      for (int64_t col = threadIdx.x; col < columns; col += kThreads) {
        grad[col] = target >= 0 && col < classes ? gradient(col, x[col]) : convert<T>(A(0));
      }
    }
  }
}

// Whether rows of `columns` values at `data` can be read in chunks: 16-bit
// and f32 logits (f64's exp spills when unrolled), every row chunk-aligned.
template <typename T>
bool packed_rows(const void* data, int64_t columns) {
  return sizeof(T) <= 4 && columns % kChunk == 0 && reinterpret_cast<uintptr_t>(data) % (kChunk * sizeof(T)) == 0;
}

// fn<kPacked>(): the chunked kernels exist for 16-bit and f32 logits only
// (f64's would spill registers, and packed_rows never picks them).
template <typename T, typename Fn>
void visit_packed(bool packed, Fn&& fn) {
  if constexpr (sizeof(T) <= 4) {
    if (packed) return fn.template operator()<true>();
  }
  return fn.template operator()<false>();
}

template <typename Fn>
void visit_targets(DType dtype, const char* kernel, Fn&& fn) {
  switch (dtype) {
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    default: refuse_operands(kernel, "targets must be i32 or i64, got", dtype);
  }
}

// A warp per row up to 256 classes, then blocks of 256 and of 512 threads
// (a vocabulary of 50257: 99 logits per thread).
template <typename Fn>
void visit_class_group(int64_t classes, Fn&& fn) {
  if (classes <= 256) return fn.template operator()<32>();
  if (classes <= 8192) return fn.template operator()<256>();
  return fn.template operator()<512>();
}

}  // namespace

void cross_entropy(const Operand& loss, const Operand& logsumexp, const Operand& row_losses, const Operand& logits,
                   const Operand& targets, int64_t ignore_index, int64_t rows, int64_t classes, int64_t columns,
                   const KernelLaunch& launch) {
  visit_row_dtype(logits.dtype, "cross_entropy", [&]<typename T>(T) {
    using A = Accumulator<T>;
    visit_targets(targets.dtype, "cross_entropy", [&]<typename Index>(Index) {
      const auto* target_data = static_cast<const Index*>(targets.data);
      if (rows > 0) {
        visit_class_group(classes, [&]<int kGroupThreads>() {
          visit_packed<T>(packed_rows<T>(logits.data, columns), [&]<bool kPacked>() {
            TESSERA_LAUNCH((cross_entropy_rows_kernel<T, Index, kGroupThreads, kPacked>),
                           row_config<kGroupThreads>(rows, launch), static_cast<A*>(row_losses.data),
                           static_cast<A*>(logsumexp.data), static_cast<const T*>(logits.data), target_data, rows,
                           classes, columns, ignore_index);
          });
        });
      }
      LaunchConfig config = config_for(1, launch);
      TESSERA_LAUNCH((cross_entropy_mean_kernel<A, Index>), config, static_cast<A*>(loss.data),
                     static_cast<const A*>(row_losses.data), target_data, rows, ignore_index);
    });
  });
}

void cross_entropy_backward(const Operand& grad_logits, const Operand& grad_loss, const Operand& scale,
                            const Operand& logits, const Operand& logsumexp, const Operand& targets,
                            int64_t ignore_index, int64_t rows, int64_t classes, int64_t columns,
                            const KernelLaunch& launch) {
  if (rows == 0 || columns == 0) return;
  visit_row_dtype(logits.dtype, "cross_entropy_backward", [&]<typename T>(T) {
    using A = Accumulator<T>;
    visit_targets(targets.dtype, "cross_entropy_backward", [&]<typename Index>(Index) {
      const auto* target_data = static_cast<const Index*>(targets.data);
      TESSERA_LAUNCH((cross_entropy_scale_kernel<A, Index>), config_for(1, launch), static_cast<A*>(scale.data),
                     static_cast<const A*>(grad_loss.data), target_data, rows, ignore_index);
      LaunchConfig config = config_for(rows * kThreads, launch);
      const bool packed = packed_rows<T>(logits.data, columns) && packed_rows<T>(grad_logits.data, columns);
      visit_packed<T>(packed, [&]<bool kPacked>() {
        TESSERA_LAUNCH((cross_entropy_backward_kernel<T, Index, kPacked>), config, static_cast<T*>(grad_logits.data),
                       static_cast<const A*>(scale.data), static_cast<const T*>(logits.data),
                       static_cast<const A*>(logsumexp.data), target_data, rows, classes, columns, ignore_index);
      });
    });
  });
}

}  // namespace tessera::cuda
