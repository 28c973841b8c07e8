// The simulator's side of the CUDA built-ins a kernel uses: the thread's
// coordinates, barriers, warp-level exchange and votes, atomics and dynamic
// shared memory. tensor/cuda/portability.h maps CUDA's names onto these; a
// kernel never calls them directly. They are ordinary (uninstrumented)
// functions, so a kernel's coordinates are never cached across a barrier.
#pragma once

#include <vector_types.h>

#include <cstdint>
#include <source_location>

namespace tessera::cuda::sim {

uint3 thread_index();
uint3 block_index();
dim3 block_dim();
dim3 grid_dim();

// __syncthreads(): every thread of the block waits here; `site` names the
// barrier in the error when threads diverge.
void sync_threads(std::source_location site);

// `exchange` is the rendezvous of a warp-wide instruction (warp_exchange);
// `match_any`/`match_all` compare the lanes' 64-bit values; `reduce` combines
// 32-bit values by the ReduceOp in `argument`.
enum class WarpOp : uint8_t {
  syncwarp, shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all, exchange, match_any, match_all, reduce
};
enum class ReduceOp : uint8_t { add_unsigned, add_signed, min_unsigned, min_signed, max_unsigned, max_signed,
                                bit_and, bit_or, bit_xor };
const char* warp_op_name(WarpOp op);

// A warp-level operation over the lanes of `mask` (which must include the
// caller): every lane of the mask arrives with the same op and mask. For the
// shuffles, `value` holds the caller's bits and the result is the source
// lane's; `argument` is the source lane, delta or lane mask. For the votes
// `value` is the predicate and the result the ballot.
uint64_t warp_operation(WarpOp op, unsigned mask, uint64_t value, int argument, int width, std::source_location site);
// The lanes of the caller's warp that have not exited.
unsigned active_mask();

// The block's dynamic shared memory (LaunchConfig::dynamic_shared_bytes).
void* dynamic_shared_memory();

// A warp-wide exchange of registers, for the instructions a warp computes
// together (mma.sync and ldmatrix.sync, emulated in tensor/cuda/mma.h):
// every lane of a full warp brings `input_bytes`; once all 32 are there,
// `combine` runs once over the 32 inputs and fills the 32 outputs (both
// indexed by lane), and each lane leaves with its own `output_bytes`. Lanes
// already exited or missing (a partial last warp) when a lane arrives, or
// lanes at another instruction or call site (.aligned), are a fault naming
// `instruction` and `site`. The lanes meet at a rendezvous of their own
// (WarpOp::exchange), which gives none of __syncwarp's memory ordering
// (neither instruction gives any); lanes that exit while others wait there
// are reported with the instruction's name.
constexpr int32_t kWarpExchangeBytes = 64;
struct WarpExchange {
  const char* instruction;
  int32_t input_bytes;   // at most kWarpExchangeBytes
  int32_t output_bytes;  // at most kWarpExchangeBytes
  void (*combine)(const void* const* inputs, void* const* outputs);
  int64_t flops = 0;  // what one execution by the warp computes (KernelCounters::flops)
};
void warp_exchange(const WarpExchange& exchange, const void* input, void* output, std::source_location site);

// Faults unless [address, address + bytes) lies in the block's shared memory
// and `address` is a multiple of `alignment`: the operand rule of an
// instruction that reads only the .shared state space (ldmatrix), checked
// before the lane's read.
void check_shared_operand(const char* instruction, const void* address, int64_t bytes, int64_t alignment,
                          std::source_location site);

// The atomic read-modify-write behind every CUDA atomic (portability.h types
// them): `update` maps the old value and the operands (two for a
// compare-and-swap) to the new value, all of `bytes` bytes (2, 4 or 8); the
// old value is written to `old_value`. The update is atomic against every
// thread of the process, the access is checked like any other at `site`, and
// it is a memory poll (a spin-wait on an atomic lets the other threads run).
using AtomicUpdate = void (*)(const void* old_value, const void* operands, void* new_value);
void atomic_update(void* address, int32_t bytes, const void* operands, AtomicUpdate update, void* old_value,
                   std::source_location site);

// Block-wide votes at a barrier (__syncthreads_count/_and/_or): every thread
// brings `predicate`, and each leaves with the number of threads whose
// predicate was non-zero.
int32_t sync_threads_count(int predicate, std::source_location site);

// The simulated clock (clock64): a per-block count that advances at every
// call and every scheduling point, so a bounded poll on it ends. Not time.
int64_t clock_ticks();
// __nanosleep: a scheduling point, as a memory poll that stored nothing.
void nano_sleep(std::source_location site);

}  // namespace tessera::cuda::sim
