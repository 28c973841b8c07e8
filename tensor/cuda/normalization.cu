// Layer norm and RMS norm on the device, forward and backward. A warp takes
// a row of up to 1024 columns (f64: 256), a block of 128 or 512 threads a
// longer one (up to kNormMaxColumns, 4096); the row stays in registers as
// chunks of 8 adjacent columns, thread `lane` of a G-thread group owning
// chunks lane, lane + G, ... Where every operand's rows start on 16 bytes
// (aligned bases, cols % 8 == 0) a chunk moves as 16-byte loads and stores
// (one for bf16, two for f32, four for f64), else one value at a time in the
// same layout: the same bits either way. A warp reduces by shuffles alone, so
// no barrier holds up the other rows' loads (a block of 128 threads a row
// with 2-byte loads ran at 2.5x and 3.9x the HBM bound on an H100, bound by
// load latency). Each block copies the weight and bias to shared memory once.
// The statistics are fixed trees in the arithmetic type (f32 for f32 and
// bf16 rows, f64 for f64 ones). The formulas are the cpu's
// (tensor/cpu/normalization.cpp): two passes over the registers (centre,
// then square) for the variance, and
//   xhat = (x - mean) rstd,  gw = dy weight,
//   dx = rstd (gw - mean(gw) - xhat mean(gw xhat))   (no mean(gw) for RMS norm).
// The backward adds its rows' weight and bias gradients per column in shared
// memory, each thread its own columns; at its end a block adds its groups'
// sums in group order into a per-block partial, and a last kernel adds the
// blocks' partials, 32 threads a column, each in block order, then a fixed
// tree: no float atomics, the same bits on every run. Block counts depend on
// the rows alone, so the bits are the same on every GPU and in the simulator.
// The residual-add variants (kAdd) are these kernels with two more
// operands: the forward adds delta to its row as it loads it (rounded to T,
// as the elementwise add rounds it) and writes that sum; the backward adds a
// residual gradient to dx after dx rounds, as the autograd engine's add of
// the two gradients would. kAdd is a template argument so that the plain
// kernels keep their registers.
#include "tensor/cuda/normalization.h"

#include <initializer_list>

#include "tensor/cuda/portability.h"
#include "tensor/cuda/row_group.h"

namespace tessera::cuda {

namespace {

// Rows a block takes at least while there are blocks to spare (2 and 4 a
// warp): its weight and bias loads and, in the backward, its partial cost a
// few percent of its rows' bytes. (Loading a group's next row while it
// reduced this one, in the old block-a-row kernels (d045b3d), measured slower
// on an H100: the forward 1.05 to 1.85 ms a GPT-2 step, the backward 2.47 to
// 2.62 ms; reverted.)
constexpr int64_t kRowsPerBlock = 16;
constexpr int64_t kBackwardRowsPerBlock = 32;
// At most this many backward blocks (so partials), whatever the rows: one
// wave of the two 8-warp blocks an H100 SM holds at 768 columns (registers),
// on its 132 SMs. A constant, not the GPU's count, so that the bits are the
// same on every GPU.
constexpr int64_t kMaxBackwardBlocks = 2 * 132;

// Dynamic shared memory a block may take without opting in to more: 48 KiB
// less what the kernels' static __shared__ values (all_reduce's) may take.
constexpr int64_t kDefaultSharedBytes = kSharedBytesWithoutOptIn - 1024;

// Columns a chunk holds: 16 bytes of bf16.
constexpr int kChunkColumns = 8;

// Eight adjacent columns of a row, as loaded (16-bit values stay two to a
// register), those past the row's end zero. Packed (every row starts on 16
// bytes and cols % 8 == 0, so a chunk is all in the row or all out) a chunk
// moves as 16-byte loads and stores; otherwise one value at a time.
template <typename T>
struct Chunk {
  using P = Pack<T>;
  static constexpr int kPacks = kChunkColumns / P::kCount;
  P packs[kPacks] = {};

  __device__ void load(const T* row, int first, int cols, bool packed) {
    if (packed) {
      if (first >= cols) return;
      const P* source = reinterpret_cast<const P*>(row + first);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) packs[k] = source[k];
    } else {
#pragma unroll
      for (int j = 0; j < kChunkColumns; ++j) {
        if (first + j < cols) value(j) = row[first + j];
      }
    }
  }
  __device__ void store(T* row, int first, int cols, bool packed) const {
    if (packed) {
      if (first >= cols) return;
      P* target = reinterpret_cast<P*>(row + first);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) target[k] = packs[k];
    } else {
#pragma unroll
      for (int j = 0; j < kChunkColumns; ++j) {
        if (first + j < cols) row[first + j] = value(j);
      }
    }
  }
  __device__ T& value(int j) { return packs[j / P::kCount].values[j % P::kCount]; }
  __device__ const T& value(int j) const { return packs[j / P::kCount].values[j % P::kCount]; }
  __device__ Accumulator<T> at(int j) const { return convert<Accumulator<T>>(value(j)); }
};

// The chunks of a row a thread of a G-thread group owns: lane, lane + G, ...
template <int kGroupThreads, int kChunks>
struct ChunkLayout {
  int lane;
  int cols;  // at most kNormMaxColumns

  __device__ int first(int p) const { return (lane + p * kGroupThreads) * kChunkColumns; }
  // fn(p, j, col) for the thread's columns before cols, in column order.
  template <typename Fn>
  __device__ void for_each(Fn&& fn) const {
#pragma unroll
    for (int p = 0; p < kChunks; ++p) {
#pragma unroll
      for (int j = 0; j < kChunkColumns; ++j) {
        if (first(p) + j < cols) fn(p, j, first(p) + j);
      }
    }
  }
};

// shared[0, cols) = source's, by the whole block (nothing for a null source).
// A block reads the weight and bias once, not once a row.
template <typename T>
__device__ void copy_to_shared(T* shared, const T* source, int cols) {
  if (source == nullptr) return;
  for (int col = static_cast<int>(threadIdx.x); col < cols; col += static_cast<int>(blockDim.x)) {
    shared[col] = source[col];
  }
}

// Up to 3 chunks a thread the bounds ask for three 8-warp blocks an SM (80
// registers), which ptxas meets without spilling; four (64) spilled.
template <typename T, int kGroupThreads, int kChunks, bool kAdd>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads,
                                  kGroupThreads == kWarpThreads && kChunks <= 3 ? 3 : 1)
    norm_kernel(T* y, Accumulator<T>* mean, Accumulator<T>* rstd, T* sum, const T* x, const T* delta,
                const T* weight, const T* bias, int64_t rows, int cols, Accumulator<T> eps, bool packed) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  const ChunkLayout<kGroupThreads, kChunks> layout{Group::lane(), cols};
  const A n = static_cast<A>(cols);
  // [weight (cols), bias (cols)]
  T* const shared_weight = dynamic_shared_memory<T>();
  T* const shared_bias = shared_weight + cols;
  copy_to_shared(shared_weight, weight, cols);
  copy_to_shared(shared_bias, bias, cols);
  __syncthreads();
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    const int64_t offset = row * cols;
    Chunk<T> xs[kChunks];
#pragma unroll
    for (int p = 0; p < kChunks; ++p) xs[p].load(x + offset, layout.first(p), cols, packed);
    if constexpr (kAdd) {
#pragma unroll
      for (int p = 0; p < kChunks; ++p) {
        Chunk<T> addend;
        addend.load(delta + offset, layout.first(p), cols, packed);
#pragma unroll
        for (int j = 0; j < kChunkColumns; ++j) xs[p].value(j) = convert<T>(xs[p].at(j) + addend.at(j));
        xs[p].store(sum + offset, layout.first(p), cols, packed);
      }
    }
    A mu = 0;
    if (mean != nullptr) {
      A total = 0;
      layout.for_each([&](int p, int j, int) { total += xs[p].at(j); });
      mu = Group::all_reduce(total, Plus{}) / n;
    }
    A squares = 0;
    layout.for_each([&](int p, int j, int) { squares += (xs[p].at(j) - mu) * (xs[p].at(j) - mu); });
    const A inverse = A(1) / std::sqrt(Group::all_reduce(squares, Plus{}) / n + eps);
#pragma unroll
    for (int p = 0; p < kChunks; ++p) {
      Chunk<T> w, b, out;
      if (weight != nullptr) w.load(shared_weight, layout.first(p), cols, packed);
      if (bias != nullptr) b.load(shared_bias, layout.first(p), cols, packed);
#pragma unroll
      for (int j = 0; j < kChunkColumns; ++j) {
        A result = (xs[p].at(j) - mu) * inverse;
        if (weight != nullptr) result *= w.at(j);
        if (bias != nullptr) result += b.at(j);
        out.value(j) = convert<T>(result);
      }
      out.store(y + offset, layout.first(p), cols, packed);
    }
    if (layout.lane == 0) {
      if (mean != nullptr) mean[row] = mu;
      rstd[row] = inverse;
    }
  }
}

// Where a group keeps its sums of column (p, j) of thread `lane` in shared
// memory: [p][j][lane], so that a warp's 32 lanes touch 32 adjacent words
// (no bank conflict). A group has kSlots of them for the weight gradient,
// then kSlots for the bias gradient.
template <int kGroupThreads, int kChunks>
struct SumSlots {
  static constexpr int kSlots = kChunks * kChunkColumns * kGroupThreads;
  __device__ static int of(int lane, int p, int j) { return (p * kChunkColumns + j) * kGroupThreads + lane; }
  __device__ static int of_column(int col) {
    const int chunk = col / kChunkColumns;
    return of(chunk % kGroupThreads, chunk / kGroupThreads, col % kChunkColumns);
  }
};

// The weight and bias gradients' sums live in shared memory: in registers
// they took the bf16 warp kernel at 768 columns to 172 registers a thread
// (one 8-warp block an SM), in shared memory it takes about 100 (two, which
// the bounds ask for). Each thread touches only its own slots until the
// block's last barrier, after which the block adds its groups' sums.
template <typename T, int kGroupThreads, int kChunks, bool kAdd>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads, kGroupThreads == kWarpThreads ? 2 : 1)
    norm_backward_kernel(T* grad_x, Accumulator<T>* partials, const T* grad_residual, const T* grad_y, const T* x,
                         const T* weight, const Accumulator<T>* mean, const Accumulator<T>* rstd, int64_t rows,
                         int cols, bool packed) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  using Slots = SumSlots<kGroupThreads, kChunks>;
  const ChunkLayout<kGroupThreads, kChunks> layout{Group::lane(), cols};
  const A n = static_cast<A>(cols);
  // [groups in the block][weight, bias][Slots::kSlots] sums, then the weight (cols)
  A* const sums = dynamic_shared_memory<A>();
  A* const dweight = sums + Group::in_block() * 2 * Slots::kSlots;
  A* const dbias = dweight + Slots::kSlots;
  T* const shared_weight = reinterpret_cast<T*>(sums + Group::kPerBlock * 2 * Slots::kSlots);
  copy_to_shared(shared_weight, weight, cols);
  __syncthreads();
  if (partials != nullptr) {
    layout.for_each([&](int p, int j, int) {
      dweight[Slots::of(layout.lane, p, j)] = 0;
      dbias[Slots::of(layout.lane, p, j)] = 0;
    });
  }
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    const int64_t offset = row * cols;
    Chunk<T> xs[kChunks], dy[kChunks];
#pragma unroll
    for (int p = 0; p < kChunks; ++p) {
      xs[p].load(x + offset, layout.first(p), cols, packed);
      dy[p].load(grad_y + offset, layout.first(p), cols, packed);
    }
    const A inverse = Group::from_lane0(layout.lane == 0 ? rstd[row] : A(0));
    const A mu = mean != nullptr ? Group::from_lane0(layout.lane == 0 ? mean[row] : A(0)) : A(0);
    A sum_gw = 0, sum_gw_xhat = 0;
#pragma unroll
    for (int p = 0; p < kChunks; ++p) {
      Chunk<T> w;
      if (weight != nullptr) w.load(shared_weight, layout.first(p), cols, packed);
#pragma unroll
      for (int j = 0; j < kChunkColumns; ++j) {
        if (layout.first(p) + j >= cols) continue;
        const A xhat = (xs[p].at(j) - mu) * inverse;
        const A g = dy[p].at(j);
        if (partials != nullptr) {
          dweight[Slots::of(layout.lane, p, j)] += g * xhat;
          dbias[Slots::of(layout.lane, p, j)] += g;
        }
        const A gw = weight != nullptr ? g * w.at(j) : g;
        sum_gw += gw;
        sum_gw_xhat += gw * xhat;
      }
    }
    const A gw_mean = mean != nullptr ? Group::all_reduce(sum_gw, Plus{}) / n : A(0);
    const A projection = Group::all_reduce(sum_gw_xhat, Plus{}) / n;
    if (grad_x == nullptr) continue;
#pragma unroll
    for (int p = 0; p < kChunks; ++p) {
      Chunk<T> w, dx;
      if (weight != nullptr) w.load(shared_weight, layout.first(p), cols, packed);
      if constexpr (kAdd) dx.load(grad_residual + offset, layout.first(p), cols, packed);
#pragma unroll
      for (int j = 0; j < kChunkColumns; ++j) {
        const A xhat = (xs[p].at(j) - mu) * inverse;
        const A gw = weight != nullptr ? dy[p].at(j) * w.at(j) : dy[p].at(j);
        const T norm_grad = convert<T>(inverse * (gw - gw_mean - xhat * projection));
        dx.value(j) = kAdd ? convert<T>(convert<A>(norm_grad) + dx.at(j)) : norm_grad;
      }
      dx.store(grad_x + offset, layout.first(p), cols, packed);
    }
  }
  if (partials == nullptr) return;
  // partials[block] = [dweight (cols), dbias (cols)] of this block's rows.
  __syncthreads();
  A* block_partial = partials + static_cast<int64_t>(blockIdx.x) * 2 * cols;
  for (int col = static_cast<int>(threadIdx.x); col < cols; col += static_cast<int>(blockDim.x)) {
    const int slot = Slots::of_column(col);
    A weight_sum = sums[slot], bias_sum = sums[Slots::kSlots + slot];
    for (int group = 1; group < Group::kPerBlock; ++group) {
      weight_sum += sums[group * 2 * Slots::kSlots + slot];
      bias_sum += sums[(group * 2 + 1) * Slots::kSlots + slot];
    }
    block_partial[col] = weight_sum;
    block_partial[cols + col] = bias_sum;
  }
}

// The partials' sum: a block takes kGradColumns adjacent partial columns
// (8 f32 are one 32-byte sector) with kGradParts threads on each; thread p
// adds blocks p, p + 32, ... in block order, then a fixed tree adds the 32
// parts. Partial column j is grad_weight[j] for j < cols, else
// grad_bias[j - cols]; the launch covers columns [first_column, end_column).
constexpr int kGradColumns = 8;
constexpr int kGradParts = kThreads / kGradColumns;

template <typename T>
__global__ void __launch_bounds__(kThreads) norm_parameter_grads_kernel(T* grad_weight, T* grad_bias,
                                                                         const Accumulator<T>* partials,
                                                                         int64_t blocks, int64_t cols,
                                                                         int64_t first_column, int64_t end_column) {
  using A = Accumulator<T>;
  __shared__ A part_sums[kGradParts][kGradColumns];
  const int lane = static_cast<int>(threadIdx.x) % kGradColumns;
  const int part = static_cast<int>(threadIdx.x) / kGradColumns;
  const int64_t column = first_column + static_cast<int64_t>(blockIdx.x) * kGradColumns + lane;
  A sum = 0;
  if (column < end_column) {
    const A* partial = partials + column;
    const int64_t row_stride = 2 * cols;
    int64_t block = part;
    // Four blocks' loads in flight before they are added, in block order.
    for (; block + 3 * kGradParts < blocks; block += 4 * kGradParts) {
      A values[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) values[k] = partial[(block + k * kGradParts) * row_stride];
#pragma unroll
      for (int k = 0; k < 4; ++k) sum += values[k];
    }
    for (; block < blocks; block += kGradParts) sum += partial[block * row_stride];
  }
  part_sums[part][lane] = sum;
  __syncthreads();
  for (int stride = kGradParts / 2; stride > 0; stride /= 2) {
    if (part < stride) part_sums[part][lane] += part_sums[part + stride][lane];
    __syncthreads();
  }
  if (part != 0 || column >= end_column) return;
  if (column < cols) {
    grad_weight[column] = convert<T>(part_sums[0][lane]);
  } else {
    grad_bias[column - cols] = convert<T>(part_sums[0][lane]);
  }
}

// The shape of the norm kernels for a row of cols of T, as
// fn.template operator()<G, kChunks>(): a warp and 1 to 4 chunks a thread up
// to 1024 columns, else a block of 512 and one chunk a thread. f64 rows keep
// one chunk a thread (at 8 bytes a value more would take twice f32's
// registers): a warp up to 256 columns, then a block of 128, then of 512.
template <typename T, typename Fn>
void visit_norm_shape(int64_t cols, Fn&& fn) {
  constexpr int64_t kWarpColumns = kWarpThreads * kChunkColumns;
  if (cols <= kWarpColumns) return fn.template operator()<kWarpThreads, 1>();
  if constexpr (sizeof(T) <= 4) {
    if (cols <= 2 * kWarpColumns) return fn.template operator()<kWarpThreads, 2>();
    if (cols <= 3 * kWarpColumns) return fn.template operator()<kWarpThreads, 3>();
    if (cols <= 4 * kWarpColumns) return fn.template operator()<kWarpThreads, 4>();
  } else {
    if (cols <= 4 * kWarpColumns) return fn.template operator()<128, 1>();
  }
  return fn.template operator()<512, 1>();
}

// The launch of a norm kernel of G-thread groups over `rows`: a block takes
// rows_per_block rows or more, there are at most max_blocks.
template <int kGroupThreads>
LaunchConfig norm_config(int64_t rows, int64_t rows_per_block, int64_t max_blocks, const KernelLaunch& launch) {
  LaunchConfig config;
  const int64_t blocks = std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, max_blocks);
  config.grid = dim3(static_cast<unsigned>(blocks));
  config.block = dim3(RowGroup<kGroupThreads>::kBlockThreads);
  config.buffers = launch.buffers;
  config.stream = launch.stream;
  return config;
}

void set_shared_bytes(LaunchConfig& config, int64_t bytes) {
  config.dynamic_shared_bytes = bytes;
  config.shared_memory_opt_in = bytes > kDefaultSharedBytes;
}

// The blocks (so the partials) of a [rows, cols] norm backward of T.
template <typename T>
int64_t norm_backward_blocks(int64_t rows, int64_t cols) {
  int64_t blocks = 0;
  visit_norm_shape<T>(cols, [&]<int kGroupThreads, int kChunks>() {
    blocks = norm_config<kGroupThreads>(rows, kBackwardRowsPerBlock, kMaxBackwardBlocks, KernelLaunch{}).grid.x;
  });
  return blocks;
}

// Whether every operand's rows start on 16 bytes: rows of a multiple of 8
// columns (a 16-byte multiple for every dtype) from 16-byte aligned bases.
bool packed_rows(int64_t cols, std::initializer_list<const Operand*> operands) {
  if (cols % kChunkColumns != 0) return false;
  for (const Operand* operand : operands) {
    if (operand->data != nullptr && reinterpret_cast<uintptr_t>(operand->data) % 16 != 0) return false;
  }
  return true;
}

template <typename T>
T* typed(const Operand& operand) {
  return static_cast<T*>(operand.data);
}

// Calls fn.template operator()<kAdd>() with kAdd = whether the op has the
// residual-add operand `addend` (delta, or grad_residual).
template <typename Fn>
void visit_add(const Operand& addend, Fn&& fn) {
  if (addend.data != nullptr) return fn.template operator()<true>();
  return fn.template operator()<false>();
}

}  // namespace

void norm(const Operand& y, const Operand& mean, const Operand& rstd, const Operand& sum, const Operand& x,
          const Operand& delta, const Operand& weight, const Operand& bias, double eps, int64_t rows, int64_t cols,
          const KernelLaunch& launch) {
  if (rows == 0 || cols == 0) return;
  if (cols > kNormMaxColumns) {
    refuse_operands("norm", "rows longer than kNormMaxColumns (4096) columns, dtype", x.dtype);
  }
  const bool packed = packed_rows(cols, {&y, &sum, &x, &delta, &weight, &bias});
  visit_row_dtype(x.dtype, "norm", [&]<typename T>(T) {
    using A = Accumulator<T>;
    visit_norm_shape<T>(cols, [&]<int kGroupThreads, int kChunks>() {
      LaunchConfig config = norm_config<kGroupThreads>(rows, kRowsPerBlock, kMaxRowBlocks, launch);
      set_shared_bytes(config, 2 * cols * static_cast<int64_t>(sizeof(T)));
      visit_add(delta, [&]<bool kAdd>() {
        TESSERA_LAUNCH((norm_kernel<T, kGroupThreads, kChunks, kAdd>), config, typed<T>(y),
                       typed<A>(mean), typed<A>(rstd), typed<T>(sum), typed<const T>(x), typed<const T>(delta),
                       typed<const T>(weight), typed<const T>(bias), rows, static_cast<int>(cols), static_cast<A>(eps),
                       packed);
      });
    });
  });
}

int64_t norm_backward_workspace_elements(DType dtype, int64_t rows, int64_t cols) {
  int64_t blocks = 0;
  visit_row_dtype(dtype, "norm_backward", [&]<typename T>(T) { blocks = norm_backward_blocks<T>(rows, cols); });
  return blocks * 2 * cols;
}

void norm_backward(const Operand& grad_x, const Operand& grad_weight, const Operand& grad_bias,
                   const Operand& workspace, const Operand& grad_residual, const Operand& grad_y, const Operand& x,
                   const Operand& weight, const Operand& mean, const Operand& rstd, int64_t rows, int64_t cols,
                   const KernelLaunch& launch) {
  if (cols == 0) return;
  if (cols > kNormMaxColumns) {
    refuse_operands("norm_backward", "rows longer than kNormMaxColumns (4096) columns, dtype", x.dtype);
  }
  const bool packed = packed_rows(cols, {&grad_x, &grad_residual, &grad_y, &x, &weight});
  visit_row_dtype(x.dtype, "norm_backward", [&]<typename T>(T) {
    using A = Accumulator<T>;
    if (rows > 0) {
      visit_norm_shape<T>(cols, [&]<int kGroupThreads, int kChunks>() {
        LaunchConfig config = norm_config<kGroupThreads>(rows, kBackwardRowsPerBlock, kMaxBackwardBlocks, launch);
        set_shared_bytes(config, static_cast<int64_t>(RowGroup<kGroupThreads>::kPerBlock) * 2 *
                                         SumSlots<kGroupThreads, kChunks>::kSlots * static_cast<int64_t>(sizeof(A)) +
                                     cols * static_cast<int64_t>(sizeof(T)));
        visit_add(grad_residual, [&]<bool kAdd>() {
          TESSERA_LAUNCH((norm_backward_kernel<T, kGroupThreads, kChunks, kAdd>), config,
                         typed<T>(grad_x), typed<A>(workspace), typed<const T>(grad_residual),
                         typed<const T>(grad_y), typed<const T>(x), typed<const T>(weight), typed<const A>(mean),
                         typed<const A>(rstd), rows, static_cast<int>(cols), packed);
        });
      });
    }
    if (grad_weight.data == nullptr && grad_bias.data == nullptr) return;
    const int64_t first_column = grad_weight.data != nullptr ? 0 : cols;
    const int64_t end_column = grad_bias.data != nullptr ? 2 * cols : cols;
    LaunchConfig config = config_for(1, launch);
    config.grid = dim3(static_cast<unsigned>((end_column - first_column + kGradColumns - 1) / kGradColumns));
    TESSERA_LAUNCH(norm_parameter_grads_kernel<T>, config, typed<T>(grad_weight), typed<T>(grad_bias),
                   typed<const A>(workspace), rows > 0 ? norm_backward_blocks<T>(rows, cols) : 0, cols, first_column,
                   end_column);
  });
}

}  // namespace tessera::cuda
