// Gather (index_select) and deterministic scatter-add (index_add) along one
// dim, on contiguous operands viewed as [outer, size, inner].
#include "tensor/cuda/indexing.h"

#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

// A block per output row: one thread reads the row's index into shared
// memory, every thread copies columns of the row (each index read once).
template <typename Word, typename Index>
__global__ void __launch_bounds__(kThreads) index_select_kernel(Word* out, const Word* x, const Index* index,
                                                               IndexGeometry geometry) {
  __shared__ int64_t source_row;
  const int64_t rows = geometry.outer * geometry.count;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t outer = row / geometry.count, j = row % geometry.count;
    if (threadIdx.x == 0) {
      const int64_t chosen = static_cast<int64_t>(index[j]);
      // An index out of range (check_index_range reports it) reads nothing: its row is zeros.
      source_row = chosen >= 0 && chosen < geometry.size ? outer * geometry.size + chosen : -1;
    }
    __syncthreads();
    Word* to = out + row * geometry.inner;
    if (source_row < 0) {
      for (int64_t column = threadIdx.x; column < geometry.inner; column += blockDim.x) to[column] = Word{};
    } else {
      const Word* from = x + source_row * geometry.inner;
      for (int64_t column = threadIdx.x; column < geometry.inner; column += blockDim.x) to[column] = from[column];
    }
    __syncthreads();  // source_row is rewritten next round
  }
}

// Each thread owns one (outer, inner) column and walks the indices in order;
// a block stages the indices through shared memory, kThreads at a time, so
// each is read from device memory once per block.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) index_add_kernel(T* out, const T* source, const Index* index,
                                                           IndexGeometry geometry) {
  __shared__ int64_t staged[kThreads];
  const int64_t columns = geometry.outer * geometry.inner;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x; base < columns;
       base += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t item = base + threadIdx.x;
    const bool active = item < columns;
    const int64_t outer = active ? item / geometry.inner : 0, column = active ? item % geometry.inner : 0;
    for (int64_t tile = 0; tile < geometry.count; tile += kThreads) {
      const int64_t in_tile = geometry.count - tile < kThreads ? geometry.count - tile : kThreads;
      if (threadIdx.x < in_tile) staged[threadIdx.x] = static_cast<int64_t>(index[tile + threadIdx.x]);
      __syncthreads();
      for (int64_t k = 0; active && k < in_tile; ++k) {
        const int64_t i = tile + k;
        if (staged[k] < 0 || staged[k] >= geometry.size) continue;  // out of range: reported, never written
        T& target = out[(outer * geometry.size + staged[k]) * geometry.inner + column];
        const T addend = source[(outer * geometry.count + i) * geometry.inner + column];
        if constexpr (std::is_floating_point_v<T>) {
          target = target + addend;
        } else {
          using U = std::make_unsigned_t<T>;  // wraps, as two's complement hardware does
          target = static_cast<T>(static_cast<U>(target) + static_cast<U>(addend));
        }
      }
      __syncthreads();  // the next tile overwrites staged
    }
  }
}

// Records the first value of `indices` outside [0, count) (other than
// `also_allowed`, when given) in `record`; the host raises it later.
template <typename Index>
__global__ void __launch_bounds__(kThreads) check_index_range_kernel(const Index* indices, int64_t n, int64_t count,
                                                                   bool has_allowed, int64_t also_allowed,
                                                                   DeviceErrorRecord* record, int64_t check) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const int64_t value = static_cast<int64_t>(indices[i]);
    if ((value >= 0 && value < count) || (has_allowed && value == also_allowed)) continue;
    if (atomicCAS(&record->raised, 0ull, 1ull) == 0ull) {
      record->check = check;
      record->position = i;
      record->value = value;
    }
  }
}

// The embedding backward's sort: 2 * kThreads keys per tile in shared memory.
constexpr int kSortTile = 2 * kThreads;
constexpr uint64_t kNoKey = ~uint64_t{0};  // padding: sorts last, matches no row

template <typename Index>
__global__ void __launch_bounds__(kThreads) make_keys_kernel(uint64_t* keys, const Index* index, int64_t count,
                                                           int64_t capacity, int64_t size) {
  for (int64_t i = first_index(); i < capacity; i += index_stride()) {
    // An index out of range (check_index_range reports it) becomes padding.
    const int64_t row = i < count ? static_cast<int64_t>(index[i]) : -1;
    keys[i] = row >= 0 && row < size ? static_cast<uint64_t>(row) << 32 | static_cast<uint64_t>(i) : kNoKey;
  }
}

// One step of the bitonic network on the pair (i, i + j), ascending where
// bit k of i is clear.
__device__ inline void compare_exchange(uint64_t& low, uint64_t& high, bool ascending) {
  if ((low > high) == ascending) {
    const uint64_t swap = low;
    low = high;
    high = swap;
  }
}

// The pair index of thread t at distance j (a power of two): i has bit j clear.
__device__ inline int64_t pair_low(int64_t t, int64_t j) { return ((t & ~(j - 1)) << 1) | (t & (j - 1)); }

// Steps j = from .. 1 of stage k inside each tile (every j < kSortTile keeps
// its pairs in a tile); from == 0 sorts the tile from scratch (k = 2 .. tile).
__global__ void __launch_bounds__(kThreads) sort_in_tiles_kernel(uint64_t* keys, int64_t k) {
  __shared__ uint64_t tile[kSortTile];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kSortTile;
  tile[threadIdx.x] = keys[base + threadIdx.x];
  tile[threadIdx.x + kThreads] = keys[base + threadIdx.x + kThreads];
  __syncthreads();
  for (int64_t stage = k == 0 ? 2 : k; stage <= (k == 0 ? kSortTile : k); stage *= 2) {
    for (int64_t j = (stage < kSortTile ? stage : kSortTile) / 2; j > 0; j /= 2) {
      const int64_t i = pair_low(threadIdx.x, j);
      compare_exchange(tile[i], tile[i + j], ((base + i) & stage) == 0);
      __syncthreads();
    }
  }
  keys[base + threadIdx.x] = tile[threadIdx.x];
  keys[base + threadIdx.x + kThreads] = tile[threadIdx.x + kThreads];
}

// One step (distance j >= kSortTile) of stage k over all keys.
__global__ void __launch_bounds__(kThreads) sort_step_kernel(uint64_t* keys, int64_t pairs, int64_t j, int64_t k) {
  for (int64_t t = first_index(); t < pairs; t += index_stride()) {
    const int64_t i = pair_low(t, j);
    uint64_t low = keys[i], high = keys[i + j];
    compare_exchange(low, high, (i & k) == 0);
    keys[i] = low;
    keys[i + j] = high;
  }
}

// Block per run of one row (found at its first sorted position s): the
// run's end by a binary search, then tiles of its keys staged in shared
// memory and each thread adding the run's source rows in order to its
// columns of out's row.
template <typename T>
__global__ void __launch_bounds__(kThreads) add_runs_kernel(T* out, const T* source, const uint64_t* keys,
                                                          int64_t count, int64_t inner) {
  __shared__ uint64_t staged[kThreads];
  __shared__ int64_t run_end;
  __shared__ bool run_starts;
  for (int64_t s = blockIdx.x; s < count; s += gridDim.x) {
    if (threadIdx.x == 0) {
      const uint64_t row_bits = keys[s] >> 32;
      // Out-of-range indices became padding keys, which sort last: no run.
      run_starts = keys[s] != kNoKey && (s == 0 || keys[s - 1] >> 32 != row_bits);
      if (run_starts) {
        int64_t low = s + 1, high = count;  // the first key of a later row, in [s + 1, count]
        while (low < high) {
          const int64_t middle = low + (high - low) / 2;
          if (keys[middle] >> 32 == row_bits) {
            low = middle + 1;
          } else {
            high = middle;
          }
        }
        run_end = low;
      }
    }
    __syncthreads();
    if (run_starts) {
      for (int64_t tile = s; tile < run_end; tile += kThreads) {
        const int64_t in_tile = run_end - tile < kThreads ? run_end - tile : kThreads;
        if (threadIdx.x < in_tile) staged[threadIdx.x] = keys[tile + threadIdx.x];
        __syncthreads();
        T* row = out + static_cast<int64_t>(staged[0] >> 32) * inner;
        for (int64_t column = threadIdx.x; column < inner; column += kThreads) {
          T sum = row[column];
          for (int64_t k = 0; k < in_tile; ++k) {
            sum = sum + source[static_cast<int64_t>(staged[k] & 0xffffffffu) * inner + column];
          }
          row[column] = sum;
        }
        __syncthreads();  // the next tile overwrites staged
      }
    }
    __syncthreads();  // run_starts and run_end are rewritten next round
  }
}

// Calls fn(Index{}) for the index dtype (i32 or i64).
template <typename Fn>
void visit_index(DType dtype, const char* kernel, Fn&& fn) {
  if (dtype == DType::i32) return fn(int32_t{});
  if (dtype == DType::i64) return fn(int64_t{});
  refuse_operands(kernel, "takes i32 or i64 indices, got", dtype);
}

}  // namespace

void index_select(const Operand& out, const Operand& x, const Operand& index, const IndexGeometry& geometry,
                  const KernelLaunch& launch) {
  const int64_t rows = geometry.outer * geometry.count;
  if (rows == 0 || geometry.inner == 0) return;
  visit_index(index.dtype, "index_select", [&]<typename Index>(Index) {
    visit_word(x.dtype, [&]<typename Word>(Word) {
      TESSERA_LAUNCH((index_select_kernel<Word, Index>), config_for(rows * kThreads, launch), static_cast<Word*>(out.data),
                     static_cast<const Word*>(x.data), static_cast<const Index*>(index.data), geometry);
    });
  });
}

void index_add(const Operand& out, const Operand& index, const Operand& source, const IndexGeometry& geometry,
               const KernelLaunch& launch) {
  const int64_t columns = geometry.outer * geometry.inner;
  if (columns == 0 || geometry.count == 0) return;
  visit_index(index.dtype, "index_add", [&]<typename Index>(Index) {
    visit_numeric(out.dtype, "index_add", "adds f32, f64, i32 or i64, got", [&]<typename T>(T) {
      TESSERA_LAUNCH((index_add_kernel<T, Index>), config_for(columns, launch), static_cast<T*>(out.data),
                     static_cast<const T*>(source.data), static_cast<const Index*>(index.data), geometry);
    });
  });
}

int64_t sort_key_capacity(int64_t count) {
  int64_t capacity = kSortTile;
  while (capacity < count) capacity *= 2;
  return capacity;
}

void index_add_rows(const Operand& out, const Operand& index, const Operand& source, const IndexGeometry& geometry,
                    uint64_t* keys, const KernelLaunch& launch) {
  if (geometry.count == 0 || geometry.inner == 0) return;
  const int64_t capacity = sort_key_capacity(geometry.count);
  visit_index(index.dtype, "index_add", [&]<typename Index>(Index) {
    TESSERA_LAUNCH(make_keys_kernel<Index>, config_for(capacity, launch), keys,
                   static_cast<const Index*>(index.data), geometry.count, capacity, geometry.size);
  });
  // Bitonic: stages up to a tile sort inside tiles; each later stage k takes
  // global steps down to distance kSortTile, then finishes inside tiles.
  LaunchConfig tiles = config_for(0, launch);
  tiles.grid = dim3(static_cast<unsigned>(capacity / kSortTile));
  TESSERA_LAUNCH(sort_in_tiles_kernel, tiles, keys, int64_t{0});
  for (int64_t k = 2 * kSortTile; k <= capacity; k *= 2) {
    for (int64_t j = k / 2; j >= kSortTile; j /= 2) {
      TESSERA_LAUNCH(sort_step_kernel, config_for(capacity / 2, launch), keys, capacity / 2, j, k);
    }
    TESSERA_LAUNCH(sort_in_tiles_kernel, tiles, keys, k);
  }
  LaunchConfig runs = config_for(0, launch);
  runs.grid = dim3(static_cast<unsigned>(geometry.count < 4096 ? geometry.count : 4096));
  if (out.dtype == DType::f32) {
    return TESSERA_LAUNCH(add_runs_kernel<float>, runs, static_cast<float*>(out.data),
                          static_cast<const float*>(source.data), static_cast<const uint64_t*>(keys), geometry.count,
                          geometry.inner);
  }
  if (out.dtype == DType::f64) {
    return TESSERA_LAUNCH(add_runs_kernel<double>, runs, static_cast<double*>(out.data),
                          static_cast<const double*>(source.data), static_cast<const uint64_t*>(keys), geometry.count,
                          geometry.inner);
  }
  refuse_operands("index_add", "sorts rows of f32 or f64, got", out.dtype);
}

void check_index_range(const Operand& indices, int64_t count, bool has_allowed, int64_t also_allowed,
                       DeviceErrorRecord* record, int64_t check, const KernelLaunch& launch) {
  if (indices.count == 0) return;
  visit_index(indices.dtype, "check_index_range", [&]<typename Index>(Index) {
    TESSERA_LAUNCH(check_index_range_kernel<Index>, config_for(indices.count, launch),
                   static_cast<const Index*>(indices.data), indices.count, count, has_allowed, also_allowed, record,
                   check);
  });
}

}  // namespace tessera::cuda
