// Launch: how this process became one or more ranks. dist::init reads the
// launcher's environment (mpirun: OMPI_COMM_WORLD_*, Slurm: SLURM_*,
// torchrun-style: RANK/WORLD_SIZE/LOCAL_RANK); under a multi-process launcher
// it joins the MPI world and runs fn once, otherwise it runs fn on
// `local_ranks` threads with the local backend. Either way fn receives the
// world group, and dist::world() returns it on the rank's thread.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "dist/backends/local_backend.h"
#include "dist/process_group.h"

namespace tessera::dist {

enum class Launcher { local, mpirun, slurm, torchrun };
std::string_view launcher_name(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::local;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};

using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
std::optional<std::string> process_environment(const std::string& name);
// This machine's host name (gethostname), or "unknown-host" when it has none.
std::string host_name();

// Reads the launcher variables (mpirun first, then Slurm, then torchrun);
// Launcher::local when none is set. Malformed or inconsistent values (a rank
// outside [0, world size), a non-number) throw naming the variable.
LaunchInfo detect_launch(const EnvironmentLookup& environment = process_environment);

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
