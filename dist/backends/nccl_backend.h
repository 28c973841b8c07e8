// The `nccl` backend: one process per GPU, device collectives through NCCL.
//
// A group holds two communicators over the same ranks. The device one runs
// the collectives on cuda tensors: each is enqueued on the group's stream of
// the GPU, after an event of the caller's stream (ProcessGroup's device
// protocol), never on the legacy stream. The host one (ncclCommSplit of the
// first) runs the collectives on cpu tensors (metadata, barriers, checkpoint
// exchanges) on the communication thread, staged through the GPU: the two
// threads never share a communicator, and each issues its own collectives in
// the same order on every rank, as NCCL requires.
//
// Reductions:
//   - by default NCCL's (its ring or tree order; bf16/f16 partial sums are
//     rounded at each step). AVG is ncclAvg: for floating types NCCL scales
//     each contribution by 1/N before summing (a premultiplied sum, so the
//     result can differ from sum-then-divide in the last bits); for integers
//     it sums and then divides (truncating). MAX and MIN are NCCL's;
//   - with ProcessGroupOptions::deterministic, floating SUM and AVG follow
//     tessera's contract on every backend (dist/reduce_op.h): each rank's
//     contributions are brought to it (send/recv for reduce-scatter, an
//     all-gather for all-reduce, which costs N times the tensor in scratch)
//     and added in rank order in f32 (f64 for f64) on the group's stream,
//     divided once for AVG and rounded once: bitwise what the local and MPI
//     backends give. Integer sums and MAX/MIN do not depend on the order, so
//     NCCL's are kept (integer AVG then truncates NCCL's wrapped sum);
//   - host collectives always reduce in rank order (an all-gather, then the
//     shared kernel of dist/reduction.h on the cpu).
//
// Failures: a watchdog thread polls each device collective's event and
// ncclCommGetAsyncError. On an error or the group's timeout it calls
// ncclCommAbort, and the collective's error (a CollectiveTimeout naming the
// collective, its sequence number, the group and, from CollectiveProgress,
// the ranks that never issued it) surfaces at the group's next collective or
// synchronize(). Every rank's watchdog times out on a collective a dead rank
// never joins, so nothing hangs. Creating a group (ncclCommInitRankConfig,
// ncclCommSplit) is nonblocking and bounded by the same timeout, naming the
// ranks that never arrived.
#pragma once

#include <chrono>
#include <memory>

#include "dist/launch/launch_environment.h"
#include "dist/launch/tcp_store.h"
#include "dist/process_group.h"

namespace tessera::dist {

// True when this build has the NCCL backend (the nvidia runtime with NCCL).
bool nccl_backend_built();

// The world over NCCL: this process is rank `launch.rank` of
// `launch.world_size`, bound to cuda:<launch.local_rank> (cuda::set_device).
// Every rank passes its connection to the job's store; rank 0's
// ncclUniqueId reaches the others through it. Collective over the world.
ProcessGroupPtr init_nccl_world(const LaunchInfo& launch, std::shared_ptr<TcpStore> store,
                                const ProcessGroupOptions& options);

// Test only: the group's next device collective starts `delay` late on the
// device (a host function stalls its stream first), so the watchdog can be
// seen to time it out on a machine with one GPU.
void delay_next_device_collective_for_testing(ProcessGroup& group, std::chrono::milliseconds delay);

}  // namespace tessera::dist
