// The `mpi` backend: one process per rank under mpirun/srun (OpenMPI), CPU
// tensors. Collectives are nonblocking MPI calls polled against the group's
// timeout; on expiry a watchdog prints the collective, its sequence number
// and the group, then aborts the whole job (MPI_Abort) rather than hang.
// bf16/f16 MAX/MIN (and NaN-propagating f32/f64 MAX/MIN) use user-defined MPI
// ops built on the shared kernel; bf16/f16 SUM/AVG, and every reduction in
// deterministic mode, are an all-to-all followed by the shared rank-order
// kernel (f32 accumulation, rounded once), bitwise equal to the local backend.
// Built when meson finds MPI (option `mpi`); otherwise these throw.
#pragma once

#include "dist/process_group.h"

namespace tessera::dist {

// True when this build has the MPI backend.
bool mpi_backend_built();

// Initialises MPI (once per process) and returns the world group over
// MPI_COMM_WORLD. local_rank/local_size come from MPI's shared-memory split.
ProcessGroupPtr init_mpi_world(const ProcessGroupOptions& options);
// Finalises MPI (after every group is done); called by dist::init.
void finalize_mpi();

}  // namespace tessera::dist
