// Causal attention on the device, forward and backward, flash-style, in O(T)
// memory: a block owns a tile of rows of one head and streams the other
// side's rows through shared memory, so nothing [T, T] exists anywhere. The
// forward keeps a running max and sum per query row (online softmax) and
// saves the log-sum-exp; the backward rebuilds the probabilities from it.
// Key tiles above the diagonal are never loaded. Accumulation is f32 (f64 for
// f64 inputs); bf16 operands are widened as they are staged.
//
// These kernels run on CUDA cores and are the reference: bf16 operands with
// head dim 64 or 128 (and 16-byte aligned rows) go to the tensor-core kernels
// of attention_mma.cu instead, routed by the entry points at the end of this
// file; f32, f64 and other head dims stay here. The backward is
// deterministic without atomics: dK and dV are owned by key-tile blocks, dQ
// by query-tile blocks, and every sum runs in a fixed order. The formulas
// are the cpu kernel's (tensor/cpu/attention.cpp): scores are (scale * q) . k
// with q scaled as it is staged, as the cpu rounds it.
#include "tensor/cuda/attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/cuda/attention_mma.h"
#include "tensor/cuda/attention_heads.h"
#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"
#include "tensor/element_conversion.h"

namespace tessera::cuda {

namespace {

// 128 threads; __launch_bounds__(kBlockThreads, 1) lets ptxas use the
// registers the accumulators need (with the block size alone it capped some
// variants at 96-128 registers and spilled).
constexpr int kBlockThreads = 128;
constexpr int kWarpSize = 32;

// The tiling for accumulation type Acc and head dims up to kMaxDim. A block
// of kBlockThreads gives each owned row kLanes threads (a power of two
// within one warp); a lane holds the row's dims lane, lane + kLanes, ... and
// the scores of keys lane, lane + kLanes, ... of the streamed tile, in
// registers. Head dims over 64 own fewer, wider rows (16 of 8 lanes, f64 8
// of 16) so that dK and dV (two accumulators per dim) fit in registers
// (32 rows of 4 lanes at head dim 128 spilled).
template <typename Acc, int kMaxDim>
struct Tiling {
  static constexpr int kOwned = kMaxDim <= 64 ? 32 : (sizeof(Acc) == 8 ? 8 : 16);
  static constexpr int kStreamed = 32;
  static constexpr int kLanes = kBlockThreads / kOwned;
  static constexpr int kDimsPerLane = kMaxDim / kLanes;
  static constexpr int kStreamedPerLane = kStreamed / kLanes;
  static_assert(kLanes <= kWarpSize && kWarpSize % kLanes == 0 && kStreamed % kLanes == 0);
};

// Staged rows are dim + 1 apart: the lanes of a warp reading one column of
// different rows hit different banks.
__device__ inline int pitch_of(int dim) { return dim + 1; }

// tile[r][d] = scale * rows[first + r][d] for r < count, zero past the
// sequence; rows are row_stride apart; every thread of the block takes part.
template <typename S, typename Acc>
__device__ void stage_rows(Acc* tile, const S* rows, int64_t row_stride, int first, int count, int seq, int dim,
                           Acc scale) {
  const int elements = count * dim, pitch = pitch_of(dim);
  for (int i = static_cast<int>(threadIdx.x); i < elements; i += kBlockThreads) {
    const int r = i / dim, d = i - r * dim, row = first + r;
    tile[r * pitch + d] = row < seq ? scale * convert<Acc>(rows[row * row_stride + d]) : Acc(0);
  }
}

// tile[r] = values[first + r] for r < count, zero past the sequence.
template <typename Acc>
__device__ void stage_values(Acc* tile, const Acc* values, int first, int count, int seq) {
  for (int r = static_cast<int>(threadIdx.x); r < count; r += kBlockThreads) {
    tile[r] = first + r < seq ? values[first + r] : Acc(0);
  }
}

// dots[j] = row . tile[lane + j * kLanes] over dim: this lane's streamed rows.
template <typename Tile, typename Acc>
__device__ void dots_with_streamed(Acc (&dots)[Tile::kStreamedPerLane], const Acc* row, const Acc* tile, int lane,
                                   int dim) {
  const int pitch = pitch_of(dim);
#pragma unroll
  for (int j = 0; j < Tile::kStreamedPerLane; ++j) dots[j] = Acc(0);
  for (int d = 0; d < dim; ++d) {
    const Acc a = row[d];
#pragma unroll
    for (int j = 0; j < Tile::kStreamedPerLane; ++j) dots[j] += a * tile[(lane + j * Tile::kLanes) * pitch + d];
  }
}

// acc[j] += sum over the streamed rows s of weights[s] * tile[s][lane + j * kLanes].
template <typename Tile, typename Acc>
__device__ void accumulate_streamed(Acc (&acc)[Tile::kDimsPerLane], const Acc* weights, const Acc* tile, int lane,
                                    int dim) {
  const int pitch = pitch_of(dim);
  for (int s = 0; s < Tile::kStreamed; ++s) {
    const Acc w = weights[s];
#pragma unroll
    for (int j = 0; j < Tile::kDimsPerLane; ++j) {
      const int d = lane + j * Tile::kLanes;
      if (d < dim) acc[j] += w * tile[s * pitch + d];
    }
  }
}

// The max or sum over the kLanes lanes of a row, by xor butterflies: every
// lane gets the same bits (a + b == b + a).
template <int kLanes, typename Acc>
__device__ Acc row_max(Acc value) {
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) {
    const Acc other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}
template <int kLanes, typename Acc>
__device__ Acc row_sum(Acc value) {
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Writes acc[j] * factor to row[lane + j * kLanes].
template <typename Tile, typename S, typename Acc>
__device__ void store_row(S* row, const Acc (&acc)[Tile::kDimsPerLane], Acc factor, int lane, int dim) {
#pragma unroll
  for (int j = 0; j < Tile::kDimsPerLane; ++j) {
    const int d = lane + j * Tile::kLanes;
    if (d < dim) row[d] = convert<S>(acc[j] * factor);
  }
}

// Grid: (heads, query tiles). Shared: q [kOwned][pitch] (scaled), k and v
// [kStreamed][pitch], p [kOwned][kStreamed + 1].
template <typename S, typename Acc, int kMaxDim>
__global__ void __launch_bounds__(kBlockThreads, 1)
    attention_forward_kernel(Heads<S> out, Acc* logsumexp, Heads<const S> q, Heads<const S> k, Heads<const S> v,
                             int heads_per_batch, int seq, int dim, Acc scale) {
  using Tile = Tiling<Acc, kMaxDim>;
  const int pitch = pitch_of(dim), p_pitch = Tile::kStreamed + 1;
  Acc* q_tile = dynamic_shared_memory<Acc>();
  Acc* k_tile = q_tile + Tile::kOwned * pitch;
  Acc* v_tile = k_tile + Tile::kStreamed * pitch;
  Acc* p_tile = v_tile + Tile::kStreamed * pitch;
  const S* q_rows = q.head(blockIdx.x, heads_per_batch);
  const S* k_rows = k.head(blockIdx.x, heads_per_batch);
  const S* v_rows = v.head(blockIdx.x, heads_per_batch);
  const int first_query = static_cast<int>(blockIdx.y) * Tile::kOwned;
  const int row = static_cast<int>(threadIdx.x) / Tile::kLanes, lane = static_cast<int>(threadIdx.x) % Tile::kLanes;
  const int query = first_query + row;
  stage_rows(q_tile, q_rows, q.row_stride, first_query, Tile::kOwned, seq, dim, scale);

  constexpr Acc kMinusInfinity = -std::numeric_limits<Acc>::infinity();
  Acc acc[Tile::kDimsPerLane];
#pragma unroll
  for (int j = 0; j < Tile::kDimsPerLane; ++j) acc[j] = Acc(0);
  Acc running_max = kMinusInfinity, running_sum = Acc(0);
  // Keys past the tile's last query row are masked for all its rows: skipped.
  const int keys_end = first_query + Tile::kOwned < seq ? first_query + Tile::kOwned : seq;
  for (int first_key = 0; first_key < keys_end; first_key += Tile::kStreamed) {
    __syncthreads();  // the previous tile's readers are done
    stage_rows(k_tile, k_rows, k.row_stride, first_key, Tile::kStreamed, seq, dim, Acc(1));
    stage_rows(v_tile, v_rows, v.row_stride, first_key, Tile::kStreamed, seq, dim, Acc(1));
    __syncthreads();
    // scores: this lane's keys of the tile, masked to -inf where not visible
    Acc scores[Tile::kStreamedPerLane];
    dots_with_streamed<Tile>(scores, q_tile + row * pitch, k_tile, lane, dim);
    Acc tile_max = kMinusInfinity;
#pragma unroll
    for (int j = 0; j < Tile::kStreamedPerLane; ++j) {
      const int key = first_key + lane + j * Tile::kLanes;
      if (key > query || key >= seq) scores[j] = kMinusInfinity;
      tile_max = scores[j] > tile_max ? scores[j] : tile_max;
    }
    // Every row sees key 0 in the first tile, so new_max is finite from then on.
    const Acc row_tile_max = row_max<Tile::kLanes>(tile_max);
    const Acc new_max = row_tile_max > running_max ? row_tile_max : running_max;
    const Acc correction = std::exp(running_max - new_max);
    Acc tile_sum = Acc(0);
#pragma unroll
    for (int j = 0; j < Tile::kStreamedPerLane; ++j) {
      const Acc p = scores[j] == kMinusInfinity ? Acc(0) : std::exp(scores[j] - new_max);
      tile_sum += p;
      p_tile[row * p_pitch + lane + j * Tile::kLanes] = p;
    }
    running_sum = running_sum * correction + row_sum<Tile::kLanes>(tile_sum);
    running_max = new_max;
#pragma unroll
    for (int j = 0; j < Tile::kDimsPerLane; ++j) acc[j] *= correction;
    __syncwarp();  // a row's probabilities come from its own lanes, all in this warp
    accumulate_streamed<Tile>(acc, p_tile + row * p_pitch, v_tile, lane, dim);
  }
  if (query < seq) {
    store_row<Tile>(out.head(blockIdx.x, heads_per_batch) + query * out.row_stride, acc, Acc(1) / running_sum, lane,
                    dim);
    if (lane == 0) logsumexp[blockIdx.x * static_cast<int64_t>(seq) + query] = running_max + std::log(running_sum);
  }
}

// delta[row] = grad_out[row] . out[row] over the rows of every head (row =
// head * seq + t): a warp per row, lanes striding over the dims, then a
// fixed butterfly.
template <typename S, typename Acc>
__global__ void __launch_bounds__(kBlockThreads, 1)
    attention_row_dots_kernel(Acc* delta, Heads<const S> grad_out, Heads<const S> out, int heads_per_batch, int seq,
                              int64_t rows, int dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kBlockThreads / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  Acc sum = Acc(0);
  if (row < rows) {
    const int64_t head = row / seq, t = row - head * seq;
    const S* grad_row = grad_out.head(head, heads_per_batch) + t * grad_out.row_stride;
    const S* out_row = out.head(head, heads_per_batch) + t * out.row_stride;
    for (int d = lane; d < dim; d += kWarpSize) sum += convert<Acc>(grad_row[d]) * convert<Acc>(out_row[d]);
  }
  sum = row_sum<kWarpSize>(sum);
  if (row < rows && lane == 0) delta[row] = sum;
}

// The same dot products with 8 lanes a row and 16-byte loads (8 bf16 or 4
// f32 a lane), where every row of both operands starts on a 16-byte
// boundary: a head dim of 64 in bf16 is one load a lane. The warp-a-row
// kernel moved 2-byte loads, 64 bytes a warp at a time, and ran at 4.3x its
// HBM bound on an H100 (ncu, GPT-2 124M at B = 16).
constexpr int kRowDotLanes = 8;

template <typename S, typename Acc>
__global__ void __launch_bounds__(kBlockThreads)
    attention_row_dots_packed_kernel(Acc* delta, Heads<const S> grad_out, Heads<const S> out, int heads_per_batch,
                                     int seq, int64_t rows, int dim) {
  using P = Pack<S>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kBlockThreads / kRowDotLanes) + threadIdx.x / kRowDotLanes;
  const int lane = static_cast<int>(threadIdx.x) % kRowDotLanes;
  Acc sum = Acc(0);
  if (row < rows) {
    const int64_t head = row / seq, t = row - head * seq;
    const P* grad_row = reinterpret_cast<const P*>(grad_out.head(head, heads_per_batch) + t * grad_out.row_stride);
    const P* out_row = reinterpret_cast<const P*>(out.head(head, heads_per_batch) + t * out.row_stride);
    for (int p = lane; p < dim / P::kCount; p += kRowDotLanes) {
      const P g = grad_row[p], o = out_row[p];
#pragma unroll
      for (int j = 0; j < P::kCount; ++j) sum += convert<Acc>(g.values[j]) * convert<Acc>(o.values[j]);
    }
  }
  sum = row_sum<kRowDotLanes>(sum);
  if (row < rows && lane == 0) delta[row] = sum;
}

// Whether every row of `heads` starts on a 16-byte boundary and holds whole 16-byte packs of `dim` values.
template <typename S>
bool packed_heads(const Operand& heads, const AttentionShape& shape, int64_t dim) {
  const auto aligned = [](int64_t elements) { return elements * static_cast<int64_t>(sizeof(S)) % 16 == 0; };
  const Heads<const S> h = heads_of<const S>(heads);
  return reinterpret_cast<uintptr_t>(h.data) % 16 == 0 && aligned(dim) && aligned(h.row_stride) &&
         aligned(h.head_stride) && (shape.heads == shape.heads_per_batch || aligned(h.batch_stride));
}

// Grid: (heads, key tiles). A block owns kOwned keys and loops over the query
// tiles that see them. Shared: k, v [kOwned][pitch], q (scaled) and grad_out
// [kStreamed][pitch], p and ds [kOwned][kStreamed + 1], lse and delta
// [kStreamed].
template <typename S, typename Acc, int kMaxDim>
__global__ void __launch_bounds__(kBlockThreads, 1)
    attention_key_grads_kernel(Heads<S> grad_k, Heads<S> grad_v, Heads<const S> grad_out, Heads<const S> q,
                               Heads<const S> k, Heads<const S> v, const Acc* logsumexp, const Acc* delta,
                               int heads_per_batch, int seq, int dim, Acc scale) {
  using Tile = Tiling<Acc, kMaxDim>;
  const int pitch = pitch_of(dim), p_pitch = Tile::kStreamed + 1;
  Acc* k_tile = dynamic_shared_memory<Acc>();
  Acc* v_tile = k_tile + Tile::kOwned * pitch;
  Acc* q_tile = v_tile + Tile::kOwned * pitch;
  Acc* go_tile = q_tile + Tile::kStreamed * pitch;
  Acc* p_tile = go_tile + Tile::kStreamed * pitch;
  Acc* ds_tile = p_tile + Tile::kOwned * p_pitch;
  Acc* lse_tile = ds_tile + Tile::kOwned * p_pitch;
  Acc* delta_tile = lse_tile + Tile::kStreamed;
  const S* q_rows = q.head(blockIdx.x, heads_per_batch);
  const S* grad_out_rows = grad_out.head(blockIdx.x, heads_per_batch);
  const Acc* head_lse = logsumexp + blockIdx.x * static_cast<int64_t>(seq);
  const Acc* head_delta = delta + blockIdx.x * static_cast<int64_t>(seq);
  const int first_key = static_cast<int>(blockIdx.y) * Tile::kOwned;
  const int row = static_cast<int>(threadIdx.x) / Tile::kLanes, lane = static_cast<int>(threadIdx.x) % Tile::kLanes;
  const int key = first_key + row;
  stage_rows(k_tile, k.head(blockIdx.x, heads_per_batch), k.row_stride, first_key, Tile::kOwned, seq, dim, Acc(1));
  stage_rows(v_tile, v.head(blockIdx.x, heads_per_batch), v.row_stride, first_key, Tile::kOwned, seq, dim, Acc(1));

  Acc grad_k_acc[Tile::kDimsPerLane], grad_v_acc[Tile::kDimsPerLane];
#pragma unroll
  for (int j = 0; j < Tile::kDimsPerLane; ++j) grad_k_acc[j] = grad_v_acc[j] = Acc(0);
  // Query tiles ending before the first key see none of these keys: skipped.
  for (int first_query = first_key / Tile::kStreamed * Tile::kStreamed; first_query < seq;
       first_query += Tile::kStreamed) {
    __syncthreads();  // the previous tile's readers are done
    stage_rows(q_tile, q_rows, q.row_stride, first_query, Tile::kStreamed, seq, dim, scale);
    stage_rows(go_tile, grad_out_rows, grad_out.row_stride, first_query, Tile::kStreamed, seq, dim, Acc(1));
    stage_values(lse_tile, head_lse, first_query, Tile::kStreamed, seq);
    stage_values(delta_tile, head_delta, first_query, Tile::kStreamed, seq);
    __syncthreads();
    // s = k . (scale q), dp = v . grad_out for this lane's queries of the tile
    Acc scores[Tile::kStreamedPerLane], grad_probs[Tile::kStreamedPerLane];
    dots_with_streamed<Tile>(scores, k_tile + row * pitch, q_tile, lane, dim);
    dots_with_streamed<Tile>(grad_probs, v_tile + row * pitch, go_tile, lane, dim);
#pragma unroll
    for (int j = 0; j < Tile::kStreamedPerLane; ++j) {
      const int local = lane + j * Tile::kLanes, query = first_query + local;
      const bool visible = query >= key && query < seq;
      // p = exp(s - lse), ds = p (dp - delta): the softmax backward, zero where masked
      const Acc p = visible ? std::exp(scores[j] - lse_tile[local]) : Acc(0);
      p_tile[row * p_pitch + local] = p;
      ds_tile[row * p_pitch + local] = visible ? p * (grad_probs[j] - delta_tile[local]) : Acc(0);
    }
    __syncwarp();  // a row's p and ds come from its own lanes, all in this warp
    // grad_v[key] += sum_i p[i] grad_out[i]; grad_k[key] += sum_i ds[i] (scale q[i])
    accumulate_streamed<Tile>(grad_v_acc, p_tile + row * p_pitch, go_tile, lane, dim);
    accumulate_streamed<Tile>(grad_k_acc, ds_tile + row * p_pitch, q_tile, lane, dim);
  }
  if (key < seq) {
    store_row<Tile>(grad_k.head(blockIdx.x, heads_per_batch) + key * grad_k.row_stride, grad_k_acc, Acc(1), lane,
                    dim);
    store_row<Tile>(grad_v.head(blockIdx.x, heads_per_batch) + key * grad_v.row_stride, grad_v_acc, Acc(1), lane,
                    dim);
  }
}

// Grid: (heads, query tiles). A block owns kOwned queries and loops over the
// key tiles they see. Shared: q (scaled) and grad_out [kOwned][pitch], k and
// v [kStreamed][pitch], ds [kOwned][kStreamed + 1], lse and delta [kOwned].
template <typename S, typename Acc, int kMaxDim>
__global__ void __launch_bounds__(kBlockThreads, 1)
    attention_query_grads_kernel(Heads<S> grad_q, Heads<const S> grad_out, Heads<const S> q, Heads<const S> k,
                                 Heads<const S> v, const Acc* logsumexp, const Acc* delta, int heads_per_batch,
                                 int seq, int dim, Acc scale) {
  using Tile = Tiling<Acc, kMaxDim>;
  const int pitch = pitch_of(dim), p_pitch = Tile::kStreamed + 1;
  Acc* q_tile = dynamic_shared_memory<Acc>();
  Acc* go_tile = q_tile + Tile::kOwned * pitch;
  Acc* k_tile = go_tile + Tile::kOwned * pitch;
  Acc* v_tile = k_tile + Tile::kStreamed * pitch;
  Acc* ds_tile = v_tile + Tile::kStreamed * pitch;
  Acc* lse_tile = ds_tile + Tile::kOwned * p_pitch;
  Acc* delta_tile = lse_tile + Tile::kOwned;
  const S* k_rows = k.head(blockIdx.x, heads_per_batch);
  const S* v_rows = v.head(blockIdx.x, heads_per_batch);
  const int first_query = static_cast<int>(blockIdx.y) * Tile::kOwned;
  const int row = static_cast<int>(threadIdx.x) / Tile::kLanes, lane = static_cast<int>(threadIdx.x) % Tile::kLanes;
  const int query = first_query + row;
  stage_rows(q_tile, q.head(blockIdx.x, heads_per_batch), q.row_stride, first_query, Tile::kOwned, seq, dim, scale);
  stage_rows(go_tile, grad_out.head(blockIdx.x, heads_per_batch), grad_out.row_stride, first_query, Tile::kOwned, seq,
             dim, Acc(1));
  stage_values(lse_tile, logsumexp + blockIdx.x * static_cast<int64_t>(seq), first_query, Tile::kOwned, seq);
  stage_values(delta_tile, delta + blockIdx.x * static_cast<int64_t>(seq), first_query, Tile::kOwned, seq);

  Acc acc[Tile::kDimsPerLane];
#pragma unroll
  for (int j = 0; j < Tile::kDimsPerLane; ++j) acc[j] = Acc(0);
  const int keys_end = first_query + Tile::kOwned < seq ? first_query + Tile::kOwned : seq;
  for (int first_key = 0; first_key < keys_end; first_key += Tile::kStreamed) {
    __syncthreads();  // the previous tile's readers are done
    stage_rows(k_tile, k_rows, k.row_stride, first_key, Tile::kStreamed, seq, dim, Acc(1));
    stage_rows(v_tile, v_rows, v.row_stride, first_key, Tile::kStreamed, seq, dim, Acc(1));
    __syncthreads();
    Acc scores[Tile::kStreamedPerLane], grad_probs[Tile::kStreamedPerLane];
    dots_with_streamed<Tile>(scores, q_tile + row * pitch, k_tile, lane, dim);
    dots_with_streamed<Tile>(grad_probs, go_tile + row * pitch, v_tile, lane, dim);
    const Acc lse = lse_tile[row], row_delta = delta_tile[row];
#pragma unroll
    for (int j = 0; j < Tile::kStreamedPerLane; ++j) {
      const int local = lane + j * Tile::kLanes, key = first_key + local;
      const bool visible = key <= query && key < seq;
      ds_tile[row * p_pitch + local] =
          visible ? std::exp(scores[j] - lse) * (grad_probs[j] - row_delta) : Acc(0);
    }
    __syncwarp();  // a row's ds come from its own lanes, all in this warp
    // grad_q[query] += sum_j ds[j] k[j], scaled once at the end
    accumulate_streamed<Tile>(acc, ds_tile + row * p_pitch, k_tile, lane, dim);
  }
  if (query < seq) {
    store_row<Tile>(grad_q.head(blockIdx.x, heads_per_batch) + query * grad_q.row_stride, acc, scale, lane, dim);
  }
}

// ---- host side ----------------------------------------------------------

// Calls fn(S{}, Acc{}, std::integral_constant<int, kMaxDim>{}) for the
// storage dtype and the smallest kernel head dim covering `dim`.
template <typename Fn>
void visit_attention(DType dtype, int dim, const char* kernel, Fn&& fn) {
  const auto with_dim = [&](auto storage, auto accumulation) {
    if (dim <= 32) return fn(storage, accumulation, std::integral_constant<int, 32>{});
    if (dim <= 64) return fn(storage, accumulation, std::integral_constant<int, 64>{});
    return fn(storage, accumulation, std::integral_constant<int, 128>{});
  };
  switch (dtype) {
    case DType::f32: return with_dim(float{}, float{});
    case DType::f64: return with_dim(double{}, double{});
    case DType::bf16: return with_dim(BFloat16{}, float{});
    default: refuse_operands(kernel, "computes f32, f64 or bf16 (with f32 accumulation), got", dtype);
  }
}

enum class AttentionKernel { forward, key_grads, query_grads };

// Dynamic shared bytes of a launch, as the kernels above lay them out.
template <typename Acc, int kMaxDim>
int64_t shared_bytes(AttentionKernel kernel, int dim) {
  using Tile = Tiling<Acc, kMaxDim>;
  const int64_t pitch = dim + 1, probs = Tile::kOwned * (Tile::kStreamed + 1);
  int64_t elements = 0;
  switch (kernel) {
    case AttentionKernel::forward: elements = (Tile::kOwned + 2 * Tile::kStreamed) * pitch + probs; break;
    case AttentionKernel::key_grads:
      elements = 2 * (Tile::kOwned + Tile::kStreamed) * pitch + 2 * probs + 2 * Tile::kStreamed;
      break;
    case AttentionKernel::query_grads:
      elements = 2 * (Tile::kOwned + Tile::kStreamed) * pitch + probs + 2 * Tile::kOwned;
      break;
  }
  return elements * static_cast<int64_t>(sizeof(Acc));
}

// Blocks (heads, owned tiles) of kBlockThreads; above 48 KiB of shared
// memory (the backward at head dims over 64, f64 over 32) the launch opts
// in, which sm_80 and later allow up to 163 KiB.
template <typename Acc, int kMaxDim>
LaunchConfig tiled_config(AttentionKernel kernel, const AttentionShape& shape, const KernelLaunch& launch) {
  using Tile = Tiling<Acc, kMaxDim>;
  LaunchConfig config;
  config.grid = dim3(static_cast<unsigned>(shape.heads),
                     static_cast<unsigned>((shape.seq + Tile::kOwned - 1) / Tile::kOwned));
  config.block = dim3(kBlockThreads);
  config.dynamic_shared_bytes = shared_bytes<Acc, kMaxDim>(kernel, shape.dim);
  config.shared_memory_opt_in = config.dynamic_shared_bytes > kSharedBytesWithoutOptIn;
  config.buffers = launch.buffers;
  config.stream = launch.stream;
  return config;
}

bool no_elements(const AttentionShape& shape) { return shape.heads == 0 || shape.seq == 0 || shape.dim == 0; }

}  // namespace

AttentionTiling attention_tiling(DType dtype, int64_t head_dim) {
  if (dtype == DType::bf16 && (head_dim == 64 || head_dim == 128)) return {kAttentionMmaTile, kAttentionMmaTile};
  AttentionTiling tiling;
  visit_attention(dtype, static_cast<int>(head_dim), "causal_attention", [&](auto, auto accumulation, auto max_dim) {
    using Tile = Tiling<decltype(accumulation), decltype(max_dim)::value>;
    tiling = {Tile::kOwned, Tile::kStreamed};
  });
  return tiling;
}

void causal_attention(const Operand& out, const Operand& logsumexp, const Operand& q, const Operand& k,
                      const Operand& v, const AttentionShape& shape, const KernelLaunch& launch) {
  if (no_elements(shape)) return;
  if (attention_on_tensor_cores(shape, q.dtype, {&out, &q, &k, &v})) {
    return causal_attention_mma(out, logsumexp, q, k, v, shape, launch);
  }
  visit_attention(q.dtype, shape.dim, "causal_attention", [&](auto storage, auto accumulation, auto max_dim) {
    using S = decltype(storage);
    using Acc = decltype(accumulation);
    constexpr int kMaxDim = decltype(max_dim)::value;
    const Acc scale = Acc(1) / std::sqrt(static_cast<Acc>(shape.dim));
    TESSERA_LAUNCH((attention_forward_kernel<S, Acc, kMaxDim>),
                   (tiled_config<Acc, kMaxDim>(AttentionKernel::forward, shape, launch)), heads_of<S>(out),
                   static_cast<Acc*>(logsumexp.data), heads_of<const S>(q), heads_of<const S>(k),
                   heads_of<const S>(v), shape.heads_per_batch, shape.seq, shape.dim, scale);
  });
}

void attention_row_dots(const Operand& delta, const Operand& grad_out, const Operand& out,
                        const AttentionShape& shape, const KernelLaunch& launch) {
  if (no_elements(shape)) return;
  visit_attention(out.dtype, shape.dim, "causal_attention_backward", [&](auto storage, auto accumulation, auto) {
    using S = decltype(storage);
    using Acc = decltype(accumulation);
    const int64_t rows = shape.heads * shape.seq;
    const bool packed = packed_heads<S>(grad_out, shape, shape.dim) && packed_heads<S>(out, shape, shape.dim);
    const int64_t rows_per_block = kBlockThreads / (packed ? kRowDotLanes : kWarpSize);
    LaunchConfig config;
    config.grid = dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
    config.block = dim3(kBlockThreads);
    config.buffers = launch.buffers;
    config.stream = launch.stream;
    if (packed) {
      TESSERA_LAUNCH((attention_row_dots_packed_kernel<S, Acc>), config, static_cast<Acc*>(delta.data),
                     heads_of<const S>(grad_out), heads_of<const S>(out), shape.heads_per_batch, shape.seq, rows,
                     shape.dim);
      return;
    }
    TESSERA_LAUNCH((attention_row_dots_kernel<S, Acc>), config, static_cast<Acc*>(delta.data),
                   heads_of<const S>(grad_out), heads_of<const S>(out), shape.heads_per_batch, shape.seq, rows,
                   shape.dim);
  });
}

void attention_key_grads(const Operand& grad_k, const Operand& grad_v, const Operand& score_grads,
                         const Operand& grad_out, const Operand& q, const Operand& k, const Operand& v,
                         const Operand& logsumexp, const Operand& delta, const AttentionShape& shape,
                         const KernelLaunch& launch) {
  if (no_elements(shape)) return;
  if (score_grads.data != nullptr ||
      attention_on_tensor_cores(shape, q.dtype, {&grad_k, &grad_v, &grad_out, &q, &k, &v})) {
    return attention_key_grads_mma(grad_k, grad_v, score_grads, grad_out, q, k, v, logsumexp, delta, shape, launch);
  }
  visit_attention(q.dtype, shape.dim, "causal_attention_backward", [&](auto storage, auto accumulation, auto max_dim) {
    using S = decltype(storage);
    using Acc = decltype(accumulation);
    constexpr int kMaxDim = decltype(max_dim)::value;
    const Acc scale = Acc(1) / std::sqrt(static_cast<Acc>(shape.dim));
    TESSERA_LAUNCH((attention_key_grads_kernel<S, Acc, kMaxDim>),
                   (tiled_config<Acc, kMaxDim>(AttentionKernel::key_grads, shape, launch)),
                   heads_of<S>(grad_k), heads_of<S>(grad_v), heads_of<const S>(grad_out), heads_of<const S>(q),
                   heads_of<const S>(k), heads_of<const S>(v), static_cast<const Acc*>(logsumexp.data),
                   static_cast<const Acc*>(delta.data), shape.heads_per_batch, shape.seq, shape.dim, scale);
  });
}

void attention_query_grads(const Operand& grad_q, const Operand& score_grads, const Operand& grad_out,
                           const Operand& q, const Operand& k, const Operand& v, const Operand& logsumexp,
                           const Operand& delta, const AttentionShape& shape, const KernelLaunch& launch) {
  if (no_elements(shape)) return;
  if (score_grads.data != nullptr || attention_on_tensor_cores(shape, q.dtype, {&grad_q, &grad_out, &q, &k, &v})) {
    return attention_query_grads_mma(grad_q, score_grads, grad_out, q, k, v, logsumexp, delta, shape, launch);
  }
  visit_attention(q.dtype, shape.dim, "causal_attention_backward", [&](auto storage, auto accumulation, auto max_dim) {
    using S = decltype(storage);
    using Acc = decltype(accumulation);
    constexpr int kMaxDim = decltype(max_dim)::value;
    const Acc scale = Acc(1) / std::sqrt(static_cast<Acc>(shape.dim));
    TESSERA_LAUNCH((attention_query_grads_kernel<S, Acc, kMaxDim>),
                   (tiled_config<Acc, kMaxDim>(AttentionKernel::query_grads, shape, launch)),
                   heads_of<S>(grad_q), heads_of<const S>(grad_out), heads_of<const S>(q), heads_of<const S>(k),
                   heads_of<const S>(v), static_cast<const Acc*>(logsumexp.data),
                   static_cast<const Acc*>(delta.data), shape.heads_per_batch, shape.seq, shape.dim, scale);
  });
}

}  // namespace tessera::cuda
