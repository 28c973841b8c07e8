// The `local` backend: N ranks as N threads of one process, collectives
// through shared memory (each rank reads its peers' buffers directly, no
// staging copies). The embedded default: a laptop, the tests, a classroom.
//
// Failure semantics: when a rank's function throws, the world is marked
// failed; every pending and later collective of every group of that world
// fails fast with RankFailed naming the dead rank and its error, and
// run_local rethrows the first (root-cause) error once all ranks are done.
#pragma once

#include <functional>
#include <memory>

#include "dist/process_group.h"
#include "tensor/storage.h"

namespace tessera::dist {

struct LocalOptions {
  ProcessGroupOptions group = ProcessGroupOptions::from_environment();
  // Intra-op threads per rank; 0 means max(1, num_threads() / world_size):
  // the caller's budget (all cores unless OMP_NUM_THREADS or set_num_threads
  // says less) shared, so ranks do not oversubscribe the machine.
  int threads_per_rank = 0;
};

// Runs fn(world) on world_size threads, rank r on thread r, and returns when
// all have finished. Each rank thread has dist::world() set, its intra-op
// thread count set, and a MemoryScope charging its allocations to the rank
// (read with rank_memory_stats()).
void run_local(int world_size, const std::function<void(const ProcessGroupPtr& world)>& fn,
               const LocalOptions& options = {});

// The memory charged to the calling rank thread of run_local: allocations made
// on it, frees credited wherever they happen. Outside run_local: the CPU totals.
MemoryStats rank_memory_stats();
void reset_rank_peak_memory();

}  // namespace tessera::dist
