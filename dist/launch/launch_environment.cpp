// Launch detection (contract in launch_environment.h): which launcher started
// this process, read from the variables it sets, checked before any rank
// relies on them.
#include "dist/launch/launch_environment.h"

#include <charconv>
#include <cstdlib>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "tensor/error.h"

namespace tessera::dist {
namespace {

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

}  // namespace tessera::dist
