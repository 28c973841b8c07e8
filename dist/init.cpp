// dist::init (contract in init.h): runs the ranks of this process, one MPI
// rank under mpirun/srun, one NCCL rank under torchrun-style variables (or
// MPI with InitOptions::nccl), N threads of the local backend otherwise.
// Also the per-thread world handle behind world().
#include "dist/init.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>

#if defined(__linux__)
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include "dist/backends/mpi_backend.h"
#include "dist/backends/nccl_backend.h"
#include "dist/launch/fault_injection.h"
#include "dist/launch/job_secret.h"
#include "dist/launch/launch_environment.h"
#include "dist/launch/lifeline.h"
#include "dist/launch/tcp_store.h"
#include "tensor/error.h"

#if TESSERA_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#endif

namespace tessera::dist {
namespace {

thread_local ProcessGroupPtr t_world;

// Ends every process of the job: a rank that leaves alone would leave the
// others blocked in their next collective.
[[noreturn]] void abort_mpi_job(const std::string& message) {
  std::fputs(message.c_str(), stderr);
  std::fflush(stderr);
  report_failure_to_launcher(message);
#if TESSERA_HAVE_MPI
  MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  std::abort();
}

// A rank ends with the launcher's process that started it (mpirun, its
// daemon on this host, slurmstepd). When a job is torn down after a lost
// host, that process can exit while a rank of its own host is still winding
// down (a SIGTERM starts train's graceful stop, whose collectives wait on
// the lost host until the timeout): the kernel then kills the rank at once,
// so nothing of the job is left behind. The launchers fork ranks from their
// main thread, whose exit is the process's.
void end_with_launcher() {
#if defined(__linux__)
  const pid_t launcher = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) std::_Exit(1);  // it was already gone
#endif
}

// Runs fn on the NCCL world made over the job's store, and releases that
// world (its communicators, then the store, which its watchdog posts
// progress to) before returning.
void run_on_nccl_world(const LaunchInfo& launch, LaunchStore& job_store, const InitOptions& options,
                       const std::function<void(const ProcessGroupPtr& world)>& fn) {
  ProcessGroupPtr world = init_nccl_world(launch, job_store.store, options.local.group);
  set_world(world);
  try {
    fn(world);
    world->synchronize();
  } catch (...) {
    set_world(nullptr);
    throw;
  }
  set_world(nullptr);
  world.reset();
  job_store.leave(launch.rank, launch.world_size);
}

// A torchrun-style rank over NCCL, or (no launcher) a world of one.
void run_nccl_rank(const LaunchInfo& launch, const InitOptions& options,
                   const std::function<void(const ProcessGroupPtr& world)>& fn) {
  if (launch.launcher == Launcher::local) {
    TESSERA_CHECK(options.local_ranks == 1,
                  "dist::init: NCCL with no launcher runs one rank (asked for {}): NCCL takes one process per GPU, "
                  "so start {} processes with mpirun, srun or torchrun-style variables",
                  options.local_ranks, options.local_ranks);
    check_faults_fit_world(1);
    // A world of one meets only itself: on loopback, with a secret of its own.
    const std::string secret = new_job_secret();
    LaunchStore own_store;
    own_store.server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, secret);
    own_store.store =
        std::make_shared<TcpStore>("127.0.0.1", own_store.server->port(), options.local.group.timeout, secret);
    return run_on_nccl_world(launch, own_store, options, fn);
  }
  LaunchStore launch_store = connect_launch_store(launch, options.local.group.timeout);
  open_process_lifeline(launch.rank, launch.world_size);
  run_on_nccl_world(launch, launch_store, options, fn);
  report_clean_end_to_launcher();
}

// One rank of a multi-process job: this process joins the MPI world.
void run_mpi_rank(const LaunchInfo& launch, const InitOptions& options,
                  const std::function<void(const ProcessGroupPtr& world)>& fn) {
  TESSERA_CHECK(mpi_backend_built(),
                "dist::init: started by {} as rank {} of {}, but this build of tessera has no MPI backend; install "
                "OpenMPI (libopenmpi-dev) and configure with -Dmpi=enabled",
                launcher_name(launch.launcher), launch.rank, launch.world_size);
  end_with_launcher();
  ProcessGroupPtr world = init_mpi_world(options.local.group);
  if (world->size() != launch.world_size || world->rank() != launch.rank) {
    const int mpi_rank = world->rank();
    const int mpi_size = world->size();
    world.reset();
    finalize_mpi();
    fail(
        "dist::init: {} says rank {} of {}, but MPI started rank {} of {}; this OpenMPI did not join the "
        "launcher's job (under Slurm: srun --mpi=pmix, or mpirun inside the allocation)",
        launcher_name(launch.launcher), launch.rank, launch.world_size, mpi_rank, mpi_size);
  }
  set_world(world);
  try {
    open_process_lifeline(world->rank(), world->size());
    if (options.nccl) {
      // The MPI world hands out the store's address, and ends the job on a failure.
      LaunchStore job_store = connect_store_through(*world, options.local.group.timeout);
      run_on_nccl_world(launch, job_store, options, fn);
    } else {
      fn(world);
    }
    world->synchronize();
  } catch (const std::exception& error) {
    abort_mpi_job(fmt::format("tessera: rank {} of {} failed: {}\naborting the job (MPI_Abort)\n", world->rank(),
                              world->size(), error.what()));
  } catch (...) {
    abort_mpi_job(fmt::format("tessera: rank {} of {} failed (not a std::exception)\naborting the job (MPI_Abort)\n",
                              world->rank(), world->size()));
  }
  set_world(nullptr);
  world.reset();
  finalize_mpi();
  report_clean_end_to_launcher();
}

}  // namespace

void init(const InitOptions& options, const std::function<void(const ProcessGroupPtr& world)>& fn) {
  const LaunchInfo launch = detect_launch();
  if (launch.launcher != Launcher::local) check_faults_fit_world(launch.world_size);  // run_local checks its own
  switch (launch.launcher) {
    case Launcher::mpirun:
    case Launcher::slurm: return run_mpi_rank(launch, options, fn);
    case Launcher::torchrun:
      if (options.nccl) return run_nccl_rank(launch, options, fn);
      // torchrun starts processes that MPI cannot connect: each would be a
      // world of its own. A world of one is just that.
      if (launch.world_size > 1) {
        fail(
            "dist::init: torchrun-style variables say this is rank {} of {} (RANK, WORLD_SIZE), but no MPI launcher "
            "started this process; tessera's multi-process backend is MPI, so start the job with `mpirun -np {}` "
            "(or srun under Slurm) instead",
            launch.rank, launch.world_size, launch.world_size);
      }
      return run_local(1, fn, options.local);
    case Launcher::local:
      if (options.nccl) return run_nccl_rank(launch, options, fn);
      TESSERA_CHECK(options.local_ranks >= 1, "dist::init: local_ranks must be at least 1, got {}",
                    options.local_ranks);
      return run_local(options.local_ranks, fn, options.local);
  }
}

const ProcessGroupPtr& world() {
  if (!t_world) {
    fail("dist::world(): no distributed context on this thread; call inside dist::init or dist::run_local");
  }
  return t_world;
}

const ProcessGroupPtr& world_or_null() { return t_world; }

void set_world(ProcessGroupPtr world) { t_world = std::move(world); }

}  // namespace tessera::dist
