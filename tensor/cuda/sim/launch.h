// A simulated kernel launch: the limits the hardware enforces, then every
// block in a seeded random order (so no kernel can rely on an order between
// blocks), each as a ThreadBlock of fibers. Errors in a kernel (a race, an
// out-of-bounds access, a divergent barrier) are tessera::Errors naming the
// kernel; with a stream they surface at its synchronize().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tensor/cuda/launch_config.h"
#include "tensor/stream.h"

namespace tessera::cuda::sim {

// Runs the kernel's body once per simulated thread. `kernel_address` tells
// the simulator which module's thread-local storage holds the kernel's
// __shared__ variables.
void launch(const char* kernel_name, const void* kernel_address, const LaunchConfig& config,
            std::function<void()> thread_body);

// One rank's part of a collective of the simulated NCCL (dist's device
// collectives): device work like a kernel. Its buffers must be live memory of
// the stream's device; they are recorded with the stream-ordering checker
// under `operation`, so the collective is ordered against the rank's other
// streams like any kernel. `body` runs on the stream when the stream reaches
// it (it meets the other ranks' parts there, and may read their devices'
// memory). Where kernels' writes are tracked (TESSERA_SIM_CHECKS), read
// buffers must be initialised (initcheck) and written ones are afterwards.
// `body(refusal)` gets the simulator's refusal (initcheck's message), or "":
// refused, it must still release the peers waiting for this part; the
// refusal is then thrown. An exception surfaces at the stream's synchronize.
// `shape` is what a timing model needs of it (sim/schedule_recorder.h).
struct CollectiveShape {
  std::string kind;   // dist::collective_name: "all_gather_into", "reduce_scatter_into", "all_reduce", "broadcast"
  int64_t bytes = 0;  // the whole buffer: an all-gather's output, a reduce-scatter's input
  int ranks = 0;      // the group's size
  std::string group = {};  // the group's name ("world", a mesh dim's "shard" or "tp"): which links it runs on
};
void launch_collective(const std::string& operation, const CollectiveShape& shape, Stream& stream,
                       const std::vector<BufferUse>& buffers, std::function<void(const std::string& refusal)> body);

// The order of blocks in launch n is a permutation drawn from (seed, n);
// setting the seed restarts n, so a sequence of launches replays exactly.
void set_block_order_seed(uint64_t seed);

// What the simulator counted, per kernel name, over every launch since the
// last reset: device bytes each launch's threads read and wrote (atomics count
// as both), and shared-memory bytes. Library calls the simulator runs as a
// whole (cublasLtMatmul) count the bytes of each operand once and their
// FLOPs (2 per multiply-add), for roofline predictions. `flops` is
// tensor-core work only: cuBLASLt calls and every warp-wide mma.sync a kernel
// executes (4096 per m16n8k16); CUDA-core arithmetic is not counted.
struct KernelCounters {
  int64_t launches = 0;
  int64_t blocks = 0;
  int64_t threads = 0;
  int64_t device_bytes_read = 0;
  int64_t device_bytes_written = 0;
  int64_t shared_bytes_accessed = 0;
  int64_t flops = 0;
};
std::map<std::string, KernelCounters> kernel_counters();
void reset_kernel_counters();
// Counts one call of a simulated library routine as one launch of `name`.
void count_library_call(const std::string& name, int64_t bytes_read, int64_t bytes_written, int64_t flops);

}  // namespace tessera::cuda::sim
