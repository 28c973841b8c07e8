// Launch detection: which launcher started this process, and as which rank,
// read from the variables it sets (mpirun: OMPI_COMM_WORLD_*, Slurm:
// SLURM_*, torchrun-style: RANK/WORLD_SIZE/LOCAL_RANK). dist::init
// (dist/init.h) reads it to decide how this process becomes its ranks.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

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

}  // namespace tessera::dist
