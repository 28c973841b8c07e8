// Causal attention on tensor cores: the flash-attention-2 schedule on
// mma.sync.m16n8k16 (bf16 in, f32 accumulate) fed by ldmatrix, for bf16 q, k,
// v and head dims 64 and 128. The CUDA-core kernels (attention.cu) stay the
// reference and serve every other dtype, head dim and layout; their entry
// points route here (attention_on_tensor_cores).
//
// A block is 4 warps and owns 64 rows of one head, 16 per warp; it stages
// the other side 64 rows at a time in shared memory and each warp multiplies
// its 16 rows against them. Scores, probabilities and the online softmax live
// in registers in mma's accumulator layout, which is also its A operand's
// layout once packed to bf16: P (and dS) go from one mma's output to the next
// one's input without touching shared memory.
//   forward   S = Q K^T (Q's fragments held in registers), running max and
//             sum per row, O += bf16(P) V; out = O / sum, lse = max + log sum.
//   dK, dV    a block owns 64 keys and loops over the query tiles that see
//             them: S^T = K Q^T, dP^T = V dO^T, P^T = exp(scale S^T - lse),
//             dS^T = P^T (dP^T - delta); dV += bf16(P^T) dO, dK += bf16(dS^T) Q;
//             and it writes bf16(dS^T), the mma operand it just formed, to a
//             scratch of the causal tiles (score_grads).
//   dQ        a block owns 64 queries and loops over the key tiles they see:
//             dQ += bf16(dS) K, with dS read from that scratch.
// dQ has its own blocks instead of atomics (the same bits on every run), and
// they no longer recompute S and dP: of the backward's seven 64 x 64 x D
// products per visible tile pair (FlashAttention-2 does five, with atomics)
// five remain, for 2 bytes per visible score written and read once. That
// scratch is O(T^2): past attention_score_grads_budget the dQ kernel
// recomputes S and dP instead (O(T) memory). Tiles above the diagonal are
// never loaded, and a warp skips the 16-row steps it cannot see.
//
// Shared tiles are row-major bf16 rows padded from D to D + 8 elements
// (144 or 272 bytes, 36 or 68 words: each row starts 4 banks after the
// previous one), not swizzled. An ldmatrix phase reads one 8x8 matrix, 8
// rows of 16 bytes, and those 8 rows then cover the 32 banks once: no bank
// conflict, for the plain and the transposed loads alike; the 16-byte staging
// stores of a quarter warp fill 128 contiguous bytes of one row, also
// conflict-free. Padding keeps the addressing plain (what the simulator's
// bounds and race checks report is a row and a column) for 8 / D more
// shared memory.
//
// Between the mma, a score costs a few CUDA-core instructions: the softmax
// runs in base 2 (one fma and one ex2.approx a score, ptx_math.h), P and dS
// go to bf16 two at a time (cvt.rn.bf16x2), and only tiles that cross the
// diagonal or the sequence's end are masked.
//
// Numerics: products of bf16 values are exact and sums are f32 (mma.h bounds
// the accumulation); the softmax statistics are f32 (exp within 2 ulp, as
// expf); logsumexp is stored in base e. P and dS are rounded to
// bf16 once, as mma's A operand, which is the one error of relative size
// 2^-8 besides the outputs' final rounding (tests/cuda/test_attention_mma.cpp
// derives the bound).
#include "tensor/cuda/attention_mma.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/cuda/mma.h"
#include "tensor/cuda/attention_heads.h"
#include "tensor/cuda/portability.h"
#include "tensor/cuda/ptx_math.h"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = static_cast<int>(kAttentionMmaTile);  // rows owned, and rows staged per step
constexpr int kWarpRows = 16;                                // rows a warp owns: mma's M
constexpr int kPad = 8;                                      // bf16 elements after each staged row
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
constexpr float kLog2E = 1.44269504088896340736f;  // log2(e): exp(x) = 2^(x log2 e)
constexpr float kLn2 = 0.693147180559945309417f;

// The row pitch of a staged tile, in bf16 elements.
template <int kDim>
constexpr int kPitch = kDim + kPad;

// tile[r][0, kDim) = rows[first + r] for r < kTile, zero past the sequence
// (a V row past it meets probability 0, and 0 * NaN would not be 0); 16 bytes
// a thread a step, every thread of the block.
template <int kDim>
__device__ void stage_tile(uint16_t* tile, const uint16_t* rows, int64_t row_stride, int first, int seq) {
  constexpr int kPieces = kDim / 8;  // 16-byte pieces of a row
#pragma unroll
  for (int step = 0; step < kTile * kPieces / kThreads; ++step) {
    const int i = static_cast<int>(threadIdx.x) + step * kThreads;
    const int r = i / kPieces, col = i % kPieces * 8;
    uint4 piece = make_uint4(0u, 0u, 0u, 0u);
    if (first + r < seq) piece = *reinterpret_cast<const uint4*>(rows + (first + r) * row_stride + col);
    *reinterpret_cast<uint4*>(tile + r * kPitch<kDim> + col) = piece;
  }
}

// factor * values[first + r] for r < kTile into tile[r], zero past the sequence.
__device__ void stage_values(float* tile, const float* values, float factor, int first, int seq) {
  const int r = static_cast<int>(threadIdx.x);
  if (r < kTile) tile[r] = first + r < seq ? values[first + r] * factor : 0.0f;
}

// The row lane `lane` gives ldmatrix_x4 for the 16x16 block of a tile at
// (row, col): lanes 0-15 rows row..row+15 at col, lanes 16-31 the same rows
// at col + 8. Read plainly, the registers are mma's A fragment of the block;
// read with .trans from a [k][n] tile, registers 0-1 are B for columns
// col..col+7 and 2-3 for col+8..col+15 (mma_layout.h).
template <int kDim>
__device__ const uint16_t* block_row(const uint16_t* tile, int row, int col, int lane) {
  return tile + (row + (lane & 15)) * kPitch<kDim> + col + (lane >> 4) * 8;
}

// The row lane `lane` gives ldmatrix_x4 to read B fragments of the 16 (n)
// by 16 (k) block at (n, k) of an [n][k] tile (K for Q K^T: a key's row is a
// column of B): lane 8m + r gives row n + (m / 2) * 8 + r at k + (m % 2) * 8,
// so registers 0-1 are B for n..n+7 and 2-3 for n+8..n+15.
template <int kDim>
__device__ const uint16_t* column_block_row(const uint16_t* tile, int n, int k, int lane) {
  return tile + (n + (lane >> 4) * 8 + (lane & 7)) * kPitch<kDim> + k + ((lane >> 3) & 1) * 8;
}

// mma's A fragment for 16 k columns of a 16-row accumulator held as 8-column
// blocks: `low` holds k columns 0-7, `high` 8-15 (mma_layout.h: A's a[0..3]
// are rows g | g+8 of columns 2t | 2t+8, the accumulator's c[0..3] rows g | g+8
// of columns 2t of its block). The caller picks the blocks: a template over
// the accumulator's block count made instantiations that differed only in
// their bounds, which GCC folded into one, then warned (-Warray-bounds) that
// head dim 128's 2-block accumulator was read through head dim 64's 8-block
// type; every index was in bounds.
__device__ void accumulator_as_a(uint32_t (&a)[4], const float (&low)[4], const float (&high)[4]) {
  a[0] = pack_bf16x2(low[0], low[1]);
  a[1] = pack_bf16x2(low[2], low[3]);
  a[2] = pack_bf16x2(high[0], high[1]);
  a[3] = pack_bf16x2(high[2], high[3]);
}

// acc[n] (columns 8n..8n+7) += A times the B fragments of two 8-column blocks.
__device__ void mma_pair(float (&low)[4], float (&high)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t b_low[2] = {b[0], b[1]}, b_high[2] = {b[2], b[3]};
  mma_m16n8k16_bf16(low, a, b_low, low);
  mma_m16n8k16_bf16(high, a, b_high, high);
}

// out += A (16 x 16, k = rows `k_row` .. k_row + 15 of a [k][kDim] tile)
// times those tile rows: every 8-column block of out.
template <int kDim>
__device__ void accumulate_rows(float (&out)[kDim / 8][4], const uint32_t (&a)[4], const uint16_t* tile, int k_row,
                                int lane) {
#pragma unroll
  for (int pair = 0; pair < kDim / 16; ++pair) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, block_row<kDim>(tile, k_row, pair * 16, lane));
    mma_pair(out[2 * pair], out[2 * pair + 1], a, b);
  }
}

// The max and the sum over the 4 lanes of a group (one accumulator row).
__device__ float group_max(float value) {
  for (int offset = 1; offset < 4; offset *= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}
__device__ float group_sum(float value) {
  for (int offset = 1; offset < 4; offset *= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Writes rows `row` (elements 0, 1) and row + 8 (elements 2, 3) of a 16 x kDim
// accumulator, times factor[0] and factor[1], where those rows are < seq.
template <int kDim>
__device__ void store_rows(Heads<uint16_t> rows, int64_t head, int heads_per_batch, int row, int seq,
                           const float (&acc)[kDim / 8][4], const float (&factor)[2], int in_group) {
  uint16_t* first = rows.head(head, heads_per_batch);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = row + half * 8;
    if (t >= seq) continue;
    uint16_t* out = first + t * rows.row_stride + 2 * in_group;
#pragma unroll
    for (int block = 0; block < kDim / 8; ++block) {
      *reinterpret_cast<uint32_t*>(out + block * 8) =
          pack_bf16x2(acc[block][2 * half] * factor[half], acc[block][2 * half + 1] * factor[half]);
    }
  }
}

// Which index of a score tile is the key: the column (forward, dQ: rows are
// queries) or the row (dK, dV: rows are keys).
enum class KeysIn { columns, rows };

// Sets to -inf the scores of a 16-row accumulator (rows first_row + g | +8,
// columns first_column + 8 block + 2t | +1) that no query sees: a key after
// its query, or a column past the sequence. Only tiles crossing the diagonal
// or the sequence's end call it; the others are all visible, and skip the
// index arithmetic, which costs as many instructions as the softmax itself.
template <KeysIn kKeys, int kBlocks>
__device__ void mask_invisible(float (&scores)[kBlocks][4], int first_row, int first_column, int seq, int lane) {
  const int group = lane >> 2, in_group = lane & 3;
#pragma unroll
  for (int block = 0; block < kBlocks; ++block) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = first_row + group + (e >> 1) * 8, column = first_column + block * 8 + 2 * in_group + (e & 1);
      const bool causal = kKeys == KeysIn::columns ? column <= row : row <= column;
      if (!causal || column >= seq) scores[block][e] = kMinusInfinity;
    }
  }
}

template <int kBlocks>
__device__ void zero(float (&acc)[kBlocks][4]) {
#pragma unroll
  for (int block = 0; block < kBlocks; ++block) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[block][e] = 0.0f;
  }
}

// The backward's two products of a warp's 16 rows against kColumns staged
// rows from `first_column`, over the head dim: xy = X Y^T and zw = Z W^T,
// where X and Z hold the warp's rows and Y and W the staged ones (S and dP,
// or their transposes when the warp owns keys).
template <int kDim, int kColumns>
__device__ void two_products(float (&xy)[kColumns / 8][4], float (&zw)[kColumns / 8][4], const uint16_t* x_tile,
                             const uint16_t* z_tile, const uint16_t* y_tile, const uint16_t* w_tile, int warp,
                             int first_column, int lane) {
  zero(xy);
  zero(zw);
#pragma unroll
  for (int d = 0; d < kDim / 16; ++d) {
    uint32_t x_a[4], z_a[4];
    ldmatrix_x4(x_a, block_row<kDim>(x_tile, warp * kWarpRows, d * 16, lane));
    ldmatrix_x4(z_a, block_row<kDim>(z_tile, warp * kWarpRows, d * 16, lane));
#pragma unroll
    for (int pair = 0; pair < kColumns / 16; ++pair) {
      uint32_t b[4];
      ldmatrix_x4(b, column_block_row<kDim>(y_tile, first_column + pair * 16, d * 16, lane));
      mma_pair(xy[2 * pair], xy[2 * pair + 1], x_a, b);
      ldmatrix_x4(b, column_block_row<kDim>(w_tile, first_column + pair * 16, d * 16, lane));
      mma_pair(zw[2 * pair], zw[2 * pair + 1], z_a, b);
    }
  }
}

// score_grads: bf16(dS^T) per head, for each query tile i the key tiles
// j <= i, each a [kTile keys][kTile queries] tile of its own (8 KiB),
// every element written by the key-gradient kernel (zero where no query sees
// the key, or past the sequence), read by the query-gradient kernel.
constexpr int kScoreTileElements = kTile * kTile;

__host__ __device__ inline int64_t causal_tiles(int64_t tiles) { return tiles * (tiles + 1) / 2; }

// The offset of tile (query_tile, key_tile) of `head` in score_grads.
__device__ int64_t score_tile_offset(int64_t head, int seq, int query_tile, int key_tile) {
  const int64_t tiles = (seq + kTile - 1) / kTile;
  return (head * causal_tiles(tiles) + causal_tiles(query_tile) + key_tile) * kScoreTileElements;
}

// Writes a 16 x 16 A fragment (rows = keys row .. row + 15 of a score tile,
// columns = queries column .. column + 15; mma_layout.h: a[0..3] are rows
// g | g+8 of columns 2t | 2t+8) to the [key][query] tile.
__device__ void store_fragment(uint16_t* tile, int row, int column, const uint32_t (&a)[4], int lane) {
  const int group = lane >> 2, in_group = lane & 3;
  uint16_t* at = tile + (row + group) * kTile + column + 2 * in_group;
  *reinterpret_cast<uint32_t*>(at) = a[0];
  *reinterpret_cast<uint32_t*>(at + 8 * kTile) = a[1];
  *reinterpret_cast<uint32_t*>(at + 8) = a[2];
  *reinterpret_cast<uint32_t*>(at + 8 * kTile + 8) = a[3];
}

// Grid: one block per (head, 64-row tile), a head's tiles consecutive in
// launch order, the longest first. Consecutive blocks thus share their head's
// K and V (or Q and dO): a wave of resident blocks spans a few heads, whose
// operands stay in L2, where a grid of (heads, tiles) walked every head's
// operands each wave (the H100 read 2.3x the forward's bytes from HBM at
// 10dfa3b). `order` 0 is the head's longest tile: the last query tile, or
// the first key tile.
struct BlockTile {
  int64_t head;
  int order;
};

__device__ BlockTile block_tile(int seq) {
  const int64_t tiles = (seq + kTile - 1) / kTile;
  return {static_cast<int64_t>(blockIdx.x) / tiles, static_cast<int>(static_cast<int64_t>(blockIdx.x) % tiles)};
}

__device__ int last_query_tiles_first(int seq, int order) {
  return ((seq + kTile - 1) / kTile - 1 - order) * kTile;
}

// Grid: block_tile's (head, query tile), the longest (last) first. Shared:
// q, k, v [kTile][kPitch]. Each warp owns 16 query rows; lane (g, t) holds
// rows g and g + 8 of them.
template <int kDim>
__global__ void __launch_bounds__(kThreads, 1)
    attention_mma_forward_kernel(Heads<uint16_t> out, float* logsumexp, Heads<const uint16_t> q,
                                 Heads<const uint16_t> k, Heads<const uint16_t> v, int heads_per_batch, int seq,
                                 float scale) {
  constexpr int kSteps = kDim / 16;  // mma k steps along the head dim
  const float scale_log2 = scale * kLog2E;
  uint16_t* q_tile = dynamic_shared_memory<uint16_t>();
  uint16_t* k_tile = q_tile + kTile * kPitch<kDim>;
  uint16_t* v_tile = k_tile + kTile * kPitch<kDim>;
  const BlockTile tile = block_tile(seq);
  const int64_t head = tile.head;
  const int first_query = last_query_tiles_first(seq, tile.order);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane >> 2, in_group = lane & 3;
  const int warp_query = first_query + warp * kWarpRows;  // this warp's first query row
  const uint16_t* k_rows = k.head(head, heads_per_batch);
  const uint16_t* v_rows = v.head(head, heads_per_batch);
  stage_tile<kDim>(q_tile, q.head(head, heads_per_batch), q.row_stride, first_query, seq);
  __syncthreads();
  uint32_t q_fragments[kSteps][4];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    ldmatrix_x4(q_fragments[step], block_row<kDim>(q_tile, warp * kWarpRows, step * 16, lane));
  }

  float o[kDim / 8][4];
  zero(o);
  float running_max[2] = {kMinusInfinity, kMinusInfinity}, running_sum[2] = {0.0f, 0.0f};  // this lane's part of the sum
  const int keys_end = first_query + kTile < seq ? first_query + kTile : seq;
  for (int first_key = 0; first_key < keys_end; first_key += kTile) {
    __syncthreads();  // the previous tile's readers are done
    stage_tile<kDim>(k_tile, k_rows, k.row_stride, first_key, seq);
    stage_tile<kDim>(v_tile, v_rows, v.row_stride, first_key, seq);
    __syncthreads();
    // 16-key steps of the tile this warp sees: up to its last query, below seq.
    const int last_key = (warp_query + kWarpRows - 1 < seq - 1 ? warp_query + kWarpRows - 1 : seq - 1) - first_key;
    const int steps = last_key / 16 + 1 < kTile / 16 ? last_key / 16 + 1 : kTile / 16;
    float s[kTile / 8][4];
    zero(s);
#pragma unroll
    for (int step = 0; step < kTile / 16; ++step) {
      if (step >= steps) continue;
#pragma unroll
      for (int d = 0; d < kSteps; ++d) {
        uint32_t b[4];
        ldmatrix_x4(b, column_block_row<kDim>(k_tile, step * 16, d * 16, lane));
        mma_pair(s[2 * step], s[2 * step + 1], q_fragments[d], b);
      }
    }
    // Mask, then the softmax in base 2 on the unscaled scores: the maximum
    // of s scaled is the scaled maximum, and p = 2^(s scale log2 e - max) is
    // one fma and one ex2. Every row sees key first_key (<= its query,
    // < seq), so the new maximum is finite.
    if (first_key + kTile - 1 > warp_query || first_key + kTile > seq) {
      mask_invisible<KeysIn::columns>(s, warp_query, first_key, seq, lane);
    }
    float tile_max[2] = {kMinusInfinity, kMinusInfinity};
#pragma unroll
    for (int block = 0; block < kTile / 8; ++block) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[block][e]);
    }
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float new_max = fmaxf(running_max[half], group_max(tile_max[half]) * scale_log2);
      correction[half] = exp2_approx(running_max[half] - new_max);  // 2^-inf = 0 on the first tile
      running_max[half] = new_max;
      running_sum[half] *= correction[half];
    }
#pragma unroll
    for (int block = 0; block < kTile / 8; ++block) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[block][e] = exp2_approx(fmaf(s[block][e], scale_log2, -running_max[e >> 1]));  // 0 where masked
        running_sum[e >> 1] += s[block][e];
      }
    }
#pragma unroll
    for (int block = 0; block < kDim / 8; ++block) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[block][e] *= correction[e >> 1];
    }
    // O += bf16(P) V over the steps this warp sees.
#pragma unroll
    for (int step = 0; step < kTile / 16; ++step) {
      if (step >= steps) continue;
      uint32_t a[4];
      accumulator_as_a(a, s[2 * step], s[2 * step + 1]);
      accumulate_rows<kDim>(o, a, v_tile, step * 16, lane);
    }
  }
  float inverse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    running_sum[half] = group_sum(running_sum[half]);
    inverse[half] = 1.0f / running_sum[half];
  }
  store_rows<kDim>(out, head, heads_per_batch, warp_query + group, seq, o, inverse, in_group);
  if (in_group == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query = warp_query + group + half * 8;
      if (query < seq) logsumexp[head * seq + query] = running_max[half] * kLn2 + std::log(running_sum[half]);
    }
  }
}

// The columns a backward kernel takes of a staged tile at once: all 64 at
// head dim 64; 16 at head dim 128, where two 16 x kDim f32 gradients already
// hold 128 registers a thread (at 32, sm_80's dK/dV kernel spills).
template <int kDim>
constexpr int kChunk = kDim <= 64 ? 64 : 16;

// Grid: block_tile's (head, key tile). A block owns 64 keys (16 a warp) and loops over
// the query tiles that see them. Shared: k, v, q, grad_out [kTile][kPitch],
// then lse and delta [kTile] f32. Accumulators are transposed (rows are this
// warp's keys, columns queries), so P^T and dS^T are mma A operands as they are.
template <int kDim, bool kHandOver>
__global__ void __launch_bounds__(kThreads, 1)
    attention_mma_key_grads_kernel(Heads<uint16_t> grad_k, Heads<uint16_t> grad_v, uint16_t* score_grads,
                                   Heads<const uint16_t> grad_out, Heads<const uint16_t> q, Heads<const uint16_t> k,
                                   Heads<const uint16_t> v, const float* logsumexp, const float* delta,
                                   int heads_per_batch, int seq, float scale) {
  constexpr int kColumns = kChunk<kDim>;
  const float scale_log2 = scale * kLog2E;
  uint16_t* k_tile = dynamic_shared_memory<uint16_t>();
  uint16_t* v_tile = k_tile + kTile * kPitch<kDim>;
  uint16_t* q_tile = v_tile + kTile * kPitch<kDim>;
  uint16_t* go_tile = q_tile + kTile * kPitch<kDim>;
  float* lse_tile = reinterpret_cast<float*>(go_tile + kTile * kPitch<kDim>);
  float* delta_tile = lse_tile + kTile;
  const BlockTile tile = block_tile(seq);
  const int64_t head = tile.head;
  const int first_key = tile.order * kTile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane >> 2, in_group = lane & 3;
  const int warp_key = first_key + warp * kWarpRows;
  const uint16_t* q_rows = q.head(head, heads_per_batch);
  const uint16_t* grad_out_rows = grad_out.head(head, heads_per_batch);
  const float* head_lse = logsumexp + head * seq;
  const float* head_delta = delta + head * seq;
  stage_tile<kDim>(k_tile, k.head(head, heads_per_batch), k.row_stride, first_key, seq);
  stage_tile<kDim>(v_tile, v.head(head, heads_per_batch), v.row_stride, first_key, seq);

  float dk[kDim / 8][4], dv[kDim / 8][4];
  zero(dk);
  zero(dv);
  for (int first_query = first_key; first_query < seq; first_query += kTile) {
    __syncthreads();  // the previous tile's readers are done
    stage_tile<kDim>(q_tile, q_rows, q.row_stride, first_query, seq);
    stage_tile<kDim>(go_tile, grad_out_rows, grad_out.row_stride, first_query, seq);
    stage_values(lse_tile, head_lse, kLog2E, first_query, seq);  // in base 2
    stage_values(delta_tile, head_delta, 1.0f, first_query, seq);
    __syncthreads();
    uint16_t* score_tile =
        kHandOver ? score_grads + score_tile_offset(head, seq, first_query / kTile, first_key / kTile) : nullptr;
#pragma unroll 1
    for (int chunk = 0; chunk < kTile / kColumns; ++chunk) {
      const int first_column = chunk * kColumns, chunk_query = first_query + first_column;
      // Queries all before this warp's keys, or all past the sequence: nothing
      // to add, and dS^T is zero there.
      if (chunk_query + kColumns - 1 < warp_key || chunk_query >= seq) {
        if constexpr (kHandOver) {
          const uint32_t zeros[4] = {0u, 0u, 0u, 0u};
#pragma unroll
          for (int step = 0; step < kColumns / 16; ++step) {
            store_fragment(score_tile, warp * kWarpRows, first_column + step * 16, zeros, lane);
          }
        }
        continue;
      }
      float st[kColumns / 8][4], dpt[kColumns / 8][4];  // S^T, dP^T: [16 keys][kColumns queries]
      two_products<kDim, kColumns>(st, dpt, k_tile, v_tile, q_tile, go_tile, warp, first_column, lane);
      if (chunk_query < warp_key + kWarpRows - 1 || chunk_query + kColumns > seq) {
        mask_invisible<KeysIn::rows>(st, warp_key, chunk_query, seq, lane);
      }
      // P^T = 2^(S^T scale log2 e - lse log2 e), dS^T = P^T (dP^T - delta),
      // zero where masked; lse and delta of a lane's two columns in one load.
#pragma unroll
      for (int block = 0; block < kColumns / 8; ++block) {
        const int local = first_column + block * 8 + 2 * in_group;
        const float2 lse = *reinterpret_cast<const float2*>(lse_tile + local);
        const float2 row_delta = *reinterpret_cast<const float2*>(delta_tile + local);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2_approx(fmaf(st[block][e], scale_log2, -(e & 1 ? lse.y : lse.x)));
          dpt[block][e] = p * (dpt[block][e] - (e & 1 ? row_delta.y : row_delta.x));
          st[block][e] = p;
        }
      }
      // dV += bf16(P^T) dO, dK += bf16(dS^T) Q over this chunk's queries;
      // bf16(dS^T) also goes to score_grads for the dQ kernel.
#pragma unroll
      for (int step = 0; step < kColumns / 16; ++step) {
        uint32_t a[4];
        accumulator_as_a(a, st[2 * step], st[2 * step + 1]);
        accumulate_rows<kDim>(dv, a, go_tile, first_column + step * 16, lane);
        accumulator_as_a(a, dpt[2 * step], dpt[2 * step + 1]);
        if constexpr (kHandOver) store_fragment(score_tile, warp * kWarpRows, first_column + step * 16, a, lane);
        accumulate_rows<kDim>(dk, a, q_tile, first_column + step * 16, lane);
      }
    }
  }
  const float dk_scale[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
  store_rows<kDim>(grad_k, head, heads_per_batch, warp_key + group, seq, dk, dk_scale, in_group);
  store_rows<kDim>(grad_v, head, heads_per_batch, warp_key + group, seq, dv, one, in_group);
}

// Grid: block_tile's (head, query tile), the longest first. A block owns 64
// queries (16 a warp) and loops over the key tiles they see, staging each
// one's K rows and its score_grads tile, dS^T [keys][queries]: read with
// ldmatrix .trans, that tile gives dS's A fragments as they are.
// Shared: k [kTile][kPitch<kDim>], then dS^T [kTile][kPitch<kTile>].
template <int kDim>
__global__ void __launch_bounds__(kThreads, 1)
    attention_mma_query_grads_kernel(Heads<uint16_t> grad_q, const uint16_t* score_grads, Heads<const uint16_t> k,
                                     int heads_per_batch, int seq, float scale) {
  uint16_t* k_tile = dynamic_shared_memory<uint16_t>();
  uint16_t* score_tile = k_tile + kTile * kPitch<kDim>;
  const BlockTile tile = block_tile(seq);
  const int64_t head = tile.head;
  const int first_query = last_query_tiles_first(seq, tile.order);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane >> 2, in_group = lane & 3;
  const int warp_query = first_query + warp * kWarpRows;
  const uint16_t* k_rows = k.head(head, heads_per_batch);

  float dq[kDim / 8][4];
  zero(dq);
  const int keys_end = first_query + kTile < seq ? first_query + kTile : seq;
  for (int first_key = 0; first_key < keys_end; first_key += kTile) {
    __syncthreads();  // the previous tile's readers are done
    stage_tile<kDim>(k_tile, k_rows, k.row_stride, first_key, seq);
    stage_tile<kTile>(score_tile, score_grads + score_tile_offset(head, seq, first_query / kTile, first_key / kTile),
                      kTile, 0, kTile);
    __syncthreads();
    // dQ += bf16(dS) K over the tile's keys, scaled once at the end; keys all
    // after this warp's queries add nothing.
#pragma unroll
    for (int step = 0; step < kTile / 16; ++step) {
      const int step_key = first_key + step * 16;
      if (step_key > warp_query + kWarpRows - 1 || step_key >= seq) continue;
      uint32_t a[4];
      ldmatrix_x4_trans(a, column_block_row<kTile>(score_tile, step * 16, warp * kWarpRows, lane));
      accumulate_rows<kDim>(dq, a, k_tile, step * 16, lane);
    }
  }
  const float dq_scale[2] = {scale, scale};
  store_rows<kDim>(grad_q, head, heads_per_batch, warp_query + group, seq, dq, dq_scale, in_group);
}

// dQ where score_grads would be too large (attention_score_grads_budget):
// S, dP and dS recomputed from q, k, v, grad_out, lse and delta, as the
// CUDA-core kernel does; O(T) memory. Grid: block_tile's (head, query tile),
// the longest first. A block owns 64 queries (16 a warp) and loops over the
// key tiles they see. Shared: q, grad_out, k, v [kTile][kPitch]; each lane
// keeps lse and delta of its two rows.
template <int kDim>
__global__ void __launch_bounds__(kThreads, 1)
    attention_mma_query_grads_recompute_kernel(Heads<uint16_t> grad_q, Heads<const uint16_t> grad_out,
                                               Heads<const uint16_t> q, Heads<const uint16_t> k,
                                               Heads<const uint16_t> v, const float* logsumexp, const float* delta,
                                               int heads_per_batch, int seq, float scale) {
  constexpr int kColumns = kChunk<kDim>;
  const float scale_log2 = scale * kLog2E;
  uint16_t* q_tile = dynamic_shared_memory<uint16_t>();
  uint16_t* go_tile = q_tile + kTile * kPitch<kDim>;
  uint16_t* k_tile = go_tile + kTile * kPitch<kDim>;
  uint16_t* v_tile = k_tile + kTile * kPitch<kDim>;
  const BlockTile tile = block_tile(seq);
  const int64_t head = tile.head;
  const int first_query = last_query_tiles_first(seq, tile.order);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane >> 2, in_group = lane & 3;
  const int warp_query = first_query + warp * kWarpRows;
  const uint16_t* k_rows = k.head(head, heads_per_batch);
  const uint16_t* v_rows = v.head(head, heads_per_batch);
  stage_tile<kDim>(q_tile, q.head(head, heads_per_batch), q.row_stride, first_query, seq);
  stage_tile<kDim>(go_tile, grad_out.head(head, heads_per_batch), grad_out.row_stride, first_query, seq);
  // lse (in base 2) and delta of this lane's two rows, read once per row (by the
  // group's first lane) and shuffled to the other three.
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = warp_query + group + half * 8;
    const bool reads = in_group == 0 && query < seq;
    row_lse[half] = __shfl_sync(0xffffffffu, reads ? logsumexp[head * seq + query] * kLog2E : 0.0f, lane & ~3);
    row_delta[half] = __shfl_sync(0xffffffffu, reads ? delta[head * seq + query] : 0.0f, lane & ~3);
  }

  float dq[kDim / 8][4];
  zero(dq);
  const int keys_end = first_query + kTile < seq ? first_query + kTile : seq;
  for (int first_key = 0; first_key < keys_end; first_key += kTile) {
    __syncthreads();  // the previous tile's readers are done
    stage_tile<kDim>(k_tile, k_rows, k.row_stride, first_key, seq);
    stage_tile<kDim>(v_tile, v_rows, v.row_stride, first_key, seq);
    __syncthreads();
#pragma unroll 1
    for (int chunk = 0; chunk < kTile / kColumns; ++chunk) {
      const int first_column = chunk * kColumns, chunk_key = first_key + first_column;
      // Keys all after this warp's queries, or all past the sequence: nothing to add.
      if (chunk_key > warp_query + kWarpRows - 1 || chunk_key >= seq) continue;
      float s[kColumns / 8][4], dp[kColumns / 8][4];  // [16 queries][kColumns keys]
      two_products<kDim, kColumns>(s, dp, q_tile, go_tile, k_tile, v_tile, warp, first_column, lane);
      if (chunk_key + kColumns - 1 > warp_query || chunk_key + kColumns > seq) {
        mask_invisible<KeysIn::columns>(s, warp_query, chunk_key, seq, lane);
      }
      // dS = 2^(S scale log2 e - lse log2 e) (dP - delta), zero where masked; kept in s.
#pragma unroll
      for (int block = 0; block < kColumns / 8; ++block) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e >> 1;
          s[block][e] = exp2_approx(fmaf(s[block][e], scale_log2, -row_lse[half])) * (dp[block][e] - row_delta[half]);
        }
      }
      // dQ += bf16(dS) K over this chunk's keys, scaled once at the end.
#pragma unroll
      for (int step = 0; step < kColumns / 16; ++step) {
        uint32_t a[4];
        accumulator_as_a(a, s[2 * step], s[2 * step + 1]);
        accumulate_rows<kDim>(dq, a, k_tile, first_column + step * 16, lane);
      }
    }
  }
  const float dq_scale[2] = {scale, scale};
  store_rows<kDim>(grad_q, head, heads_per_batch, warp_query + group, seq, dq, dq_scale, in_group);
}

// ---- host side ----------------------------------------------------------

enum class Kernel { forward, key_grads, query_grads, query_grads_recompute };

// Dynamic shared bytes: the bf16 tiles (q, k, v in the forward; k, v, q,
// dO and lse, delta for the key gradients; k and a score tile for dQ, or q,
// dO, k and v where it recomputes the scores).
int64_t shared_bytes(Kernel kernel, int dim) {
  const int64_t tile = int64_t{kTile} * (dim + kPad) * 2;
  switch (kernel) {
    case Kernel::forward: return 3 * tile;
    case Kernel::key_grads: return 4 * tile + 2 * int64_t{kTile} * 4;
    case Kernel::query_grads: return tile + int64_t{kTile} * (kTile + kPad) * 2;
    case Kernel::query_grads_recompute: return 4 * tile;
  }
  return 0;
}

// Blocks (heads, 64-row tiles) of 4 warps; above 48 KiB (head dim 128, and
// the backward at 64) the launch opts in, as sm_80 and later allow.
LaunchConfig mma_config(Kernel kernel, const AttentionShape& shape, const KernelLaunch& launch) {
  LaunchConfig config;
  // At most 2^31 - 1 blocks: attention_shape (kernel_table.cpp) checks.
  config.grid = dim3(static_cast<unsigned>(shape.heads * ((shape.seq + kTile - 1) / kTile)));
  config.block = dim3(kThreads);
  config.dynamic_shared_bytes = shared_bytes(kernel, shape.dim);
  config.shared_memory_opt_in = config.dynamic_shared_bytes > kSharedBytesWithoutOptIn;
  config.buffers = launch.buffers;
  config.stream = launch.stream;
  return config;
}

float scale_of(const AttentionShape& shape) { return 1.0f / std::sqrt(static_cast<float>(shape.dim)); }

// Calls fn(std::integral_constant<int, D>{}) for head dim 64 or 128.
template <typename Fn>
void visit_dim(int dim, Fn&& fn) {
  if (dim == 64) return fn(std::integral_constant<int, 64>{});
  return fn(std::integral_constant<int, 128>{});
}

}  // namespace

bool attention_on_tensor_cores(const AttentionShape& shape, DType dtype,
                               std::initializer_list<const Operand*> operands) {
  if (dtype != DType::bf16 || (shape.dim != 64 && shape.dim != 128)) return false;
  for (const Operand* operand : operands) {
    if (reinterpret_cast<uintptr_t>(operand->data) % 16 != 0) return false;
    for (int dim = 0; dim < 3; ++dim) {
      if (operand->layout.sizes[dim] > 1 && operand->layout.strides[dim] % 8 != 0) return false;
    }
  }
  return true;
}

void causal_attention_mma(const Operand& out, const Operand& logsumexp, const Operand& q, const Operand& k,
                          const Operand& v, const AttentionShape& shape, const KernelLaunch& launch) {
  visit_dim(shape.dim, [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    TESSERA_LAUNCH((attention_mma_forward_kernel<kDim>), (mma_config(Kernel::forward, shape, launch)),
                   heads_of<uint16_t>(out), static_cast<float*>(logsumexp.data), heads_of<const uint16_t>(q),
                   heads_of<const uint16_t>(k), heads_of<const uint16_t>(v), shape.heads_per_batch, shape.seq,
                   scale_of(shape));
  });
}

int64_t attention_score_grads_elements(const AttentionShape& shape) {
  return shape.heads * causal_tiles((shape.seq + kTile - 1) / kTile) * kScoreTileElements;
}

void attention_key_grads_mma(const Operand& grad_k, const Operand& grad_v, const Operand& score_grads,
                             const Operand& grad_out, const Operand& q, const Operand& k, const Operand& v,
                             const Operand& logsumexp, const Operand& delta, const AttentionShape& shape,
                             const KernelLaunch& launch) {
  visit_dim(shape.dim, [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    const auto launch_with = [&]<bool kHandOver>() {
      TESSERA_LAUNCH((attention_mma_key_grads_kernel<kDim, kHandOver>), (mma_config(Kernel::key_grads, shape, launch)),
                     heads_of<uint16_t>(grad_k), heads_of<uint16_t>(grad_v), static_cast<uint16_t*>(score_grads.data),
                     heads_of<const uint16_t>(grad_out), heads_of<const uint16_t>(q), heads_of<const uint16_t>(k),
                     heads_of<const uint16_t>(v), static_cast<const float*>(logsumexp.data),
                     static_cast<const float*>(delta.data), shape.heads_per_batch, shape.seq, scale_of(shape));
    };
    if (score_grads.data != nullptr) return launch_with.template operator()<true>();
    launch_with.template operator()<false>();
  });
}

void attention_query_grads_mma(const Operand& grad_q, const Operand& score_grads, const Operand& grad_out,
                               const Operand& q, const Operand& k, const Operand& v, const Operand& logsumexp,
                               const Operand& delta, const AttentionShape& shape, const KernelLaunch& launch) {
  visit_dim(shape.dim, [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    if (score_grads.data != nullptr) {
      TESSERA_LAUNCH((attention_mma_query_grads_kernel<kDim>), (mma_config(Kernel::query_grads, shape, launch)),
                     heads_of<uint16_t>(grad_q), static_cast<const uint16_t*>(score_grads.data),
                     heads_of<const uint16_t>(k), shape.heads_per_batch, shape.seq, scale_of(shape));
      return;
    }
    TESSERA_LAUNCH((attention_mma_query_grads_recompute_kernel<kDim>),
                   (mma_config(Kernel::query_grads_recompute, shape, launch)), heads_of<uint16_t>(grad_q),
                   heads_of<const uint16_t>(grad_out), heads_of<const uint16_t>(q), heads_of<const uint16_t>(k),
                   heads_of<const uint16_t>(v), static_cast<const float*>(logsumexp.data),
                   static_cast<const float*>(delta.data), shape.heads_per_batch, shape.seq, scale_of(shape));
  });
}

}  // namespace tessera::cuda
