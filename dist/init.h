// dist::init: how this process becomes one or more ranks. It reads the
// launcher's environment (dist/launch/launch_environment.h); under a
// multi-process launcher it joins the MPI world and runs fn once, otherwise it
// runs fn on `local_ranks` threads with the local backend. Either way fn
// receives the world group, and dist::world() returns it on the rank's thread.
#pragma once

#include <functional>

#include "dist/backends/local_backend.h"
#include "dist/process_group.h"

namespace tessera::dist {

struct InitOptions {
  int local_ranks = 1;  // ranks to simulate when no launcher is detected
  LocalOptions local;   // its group options also apply to the MPI and NCCL worlds
  // The world over NCCL (dist/backends/nccl_backend.h), one process per GPU bound by
  // its local rank: under mpirun/srun (the MPI world then only hands out the
  // store's address and ends the job on a failure), under torchrun-style
  // variables (MASTER_ADDR/MASTER_PORT name the store), or, with no launcher,
  // one rank on cuda:0. Needs an nvidia build with NCCL.
  bool nccl = false;
};

// Runs fn on every rank of this process (see above) and rethrows the first error.
void init(const InitOptions& options, const std::function<void(const ProcessGroupPtr& world)>& fn);

// The world group of the calling rank (set by init and run_local on each
// rank's thread); throws when called outside them.
const ProcessGroupPtr& world();
// The same, or null outside them (for code that also runs in one process).
const ProcessGroupPtr& world_or_null();
// Sets the calling thread's world (used by the backends' launchers).
void set_world(ProcessGroupPtr world);

}  // namespace tessera::dist
