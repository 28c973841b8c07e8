// Launch (contract in launch.h): reads the launcher's environment, then runs
// the ranks of this process: one MPI rank under mpirun/srun, N threads of the
// local backend otherwise. Also the per-thread world handle behind world().
#include "dist/launch/launch_environment.h"

#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>

#if defined(__linux__)
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include "dist/launch/lifeline.h"
#include "dist/backends/mpi_backend.h"
#include "dist/backends/nccl_backend.h"
#include "dist/launch/tcp_store.h"
#include "tensor/error.h"

#if TESSERA_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#endif

namespace tessera::dist {
namespace {

thread_local ProcessGroupPtr t_world;

// A whole-string decimal integer in [min, INT_MAX], or an error naming the variable.
int parse_int(const std::string& variable, const std::string& text, int min) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end) {
    fail("dist::detect_launch: {}='{}' is not an integer", variable, text);
  }
  if (value < min) fail("dist::detect_launch: {}={} must be at least {}", variable, value, min);
  return value;
}

// Reads one launcher's variables. Rank and size must both be set; the local
// rank defaults to 0 and the local size to 1, but a nonzero local rank needs
// its local size.
LaunchInfo read_launch(Launcher launcher, const EnvironmentLookup& environment, const std::string& rank_variable,
                       const std::string& size_variable, const std::string& local_rank_variable,
                       const std::optional<int>& local_size, const std::string& local_size_variable) {
  std::optional<std::string> rank = environment(rank_variable);
  std::optional<std::string> size = environment(size_variable);
  if (!rank || !size) {
    fail("dist::detect_launch: {} is set but {} is not; the {} launcher sets both",
         rank ? rank_variable : size_variable, rank ? size_variable : rank_variable, launcher_name(launcher));
  }
  LaunchInfo info;
  info.launcher = launcher;
  info.rank = parse_int(rank_variable, *rank, 0);
  info.world_size = parse_int(size_variable, *size, 1);
  if (info.rank >= info.world_size) {
    fail("dist::detect_launch: {}={} is outside [0, {}) given by {}", rank_variable, info.rank, info.world_size,
         size_variable);
  }
  if (std::optional<std::string> local_rank = environment(local_rank_variable)) {
    info.local_rank = parse_int(local_rank_variable, *local_rank, 0);
  }
  if (!local_size && info.local_rank > 0) {
    fail("dist::detect_launch: {}={} is set but the local size ({}) is not", local_rank_variable, info.local_rank,
         local_size_variable);
  }
  info.local_world_size = local_size.value_or(1);
  if (info.local_world_size > info.world_size) {
    fail("dist::detect_launch: local size {}={} exceeds the world size {}={}", local_size_variable,
         info.local_world_size, size_variable, info.world_size);
  }
  if (info.local_rank >= info.local_world_size) {
    fail("dist::detect_launch: {}={} is outside [0, {}) given by {}", local_rank_variable, info.local_rank,
         info.local_world_size, local_size_variable);
  }
  return info;
}

std::optional<int> read_optional_size(const EnvironmentLookup& environment, const std::string& variable) {
  std::optional<std::string> text = environment(variable);
  if (!text) return std::nullopt;
  return parse_int(variable, *text, 1);
}

// Slurm's tasks per node come as "2(x3),1": 2 tasks on each of 3 nodes, then
// 1. This node's count is entry SLURM_NODEID of that list (the first entry
// when SLURM_NODEID is missing).
int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  auto malformed = [&] { fail("dist::detect_launch: SLURM_TASKS_PER_NODE='{}' is malformed", tasks_per_node); };
  auto positive = [&](std::string_view text) {
    int value = 0;
    auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || stop != text.data() + text.size() || value < 1) malformed();
    return value;
  };
  int first_node = 0;  // of the current entry
  std::string_view rest = tasks_per_node;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    int repeat = 1;
    if (const size_t open = entry.find("(x"); open != std::string_view::npos) {
      if (entry.back() != ')') malformed();
      repeat = positive(entry.substr(open + 2, entry.size() - open - 3));
      entry = entry.substr(0, open);
    }
    const int tasks = positive(entry);
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
  }
  fail("dist::detect_launch: SLURM_TASKS_PER_NODE='{}' lists {} nodes; SLURM_NODEID={} is not among them",
       tasks_per_node, first_node, node);
}

std::optional<int> slurm_local_size(const EnvironmentLookup& environment) {
  if (std::optional<int> per_node = read_optional_size(environment, "SLURM_NTASKS_PER_NODE")) return per_node;
  std::optional<std::string> tasks_per_node = environment("SLURM_TASKS_PER_NODE");
  if (!tasks_per_node) return std::nullopt;
  int node = 0;
  if (std::optional<std::string> node_id = environment("SLURM_NODEID")) node = parse_int("SLURM_NODEID", *node_id, 0);
  return slurm_tasks_on_node(*tasks_per_node, node);
}

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
    LaunchStore own_store;
    own_store.server = std::make_unique<TcpStoreServer>(0);
    own_store.store = std::make_shared<TcpStore>("127.0.0.1", own_store.server->port(), options.local.group.timeout);
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

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::local: return "local";
    case Launcher::mpirun: return "mpirun";
    case Launcher::slurm: return "slurm";
    case Launcher::torchrun: return "torchrun";
  }
  return "unknown";
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

std::optional<std::string> process_environment(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// mpirun first: started inside a Slurm allocation, its processes carry both sets.
LaunchInfo detect_launch(const EnvironmentLookup& environment) {
  if (environment("OMPI_COMM_WORLD_RANK") || environment("OMPI_COMM_WORLD_SIZE")) {
    return read_launch(Launcher::mpirun, environment, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK", read_optional_size(environment, "OMPI_COMM_WORLD_LOCAL_SIZE"),
                       "OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  // SLURM_PROCID, not SLURM_NTASKS: a batch script has the allocation's task
  // count without being one of srun's tasks.
  if (environment("SLURM_PROCID")) {
    return read_launch(Launcher::slurm, environment, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                       slurm_local_size(environment), "SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE");
  }
  if (environment("RANK") || environment("WORLD_SIZE")) {
    return read_launch(Launcher::torchrun, environment, "RANK", "WORLD_SIZE", "LOCAL_RANK",
                       read_optional_size(environment, "LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE");
  }
  return LaunchInfo{};
}

void init(const InitOptions& options, const std::function<void(const ProcessGroupPtr& world)>& fn) {
  const LaunchInfo launch = detect_launch();
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
