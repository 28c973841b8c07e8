// Stop forwarding (contract in stop_forwarding.h): the command's kind from
// its program's name, a rank proven by its environment, and the plan.
#include "dist/launch/stop_forwarding.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>

#include "dist/launch/lifeline.h"

namespace tessera::dist {
namespace {

std::string program_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Set by the schedulers that signal every process of a job: Slurm, PBS,
// Grid Engine, LSF.
constexpr const char* kAllocationVariables[] = {"SLURM_JOB_ID", "PBS_NODEFILE", "PE_HOSTFILE", "LSB_MCPU_HOSTS"};

}  // namespace

JobCommand job_command_of(const std::vector<std::string>& command) {
  if (command.empty()) return JobCommand::other;
  const std::string program = program_name(command.front());
  if (program == "mpirun" || program == "mpiexec" || program == "orterun" || program == "mpirun.openmpi") {
    return JobCommand::mpirun;
  }
  return program == "srun" ? JobCommand::srun : JobCommand::other;
}

bool in_batch_allocation(const EnvironmentLookup& environment) {
  return std::any_of(std::begin(kAllocationVariables), std::end(kAllocationVariables),
                     [&](const char* name) { return environment(name).has_value(); });
}

std::vector<std::string> with_mpirun_kill_timeout(std::vector<std::string> command, int seconds,
                                                  const EnvironmentLookup& environment) {
  if (job_command_of(command) != JobCommand::mpirun || !in_batch_allocation(environment)) return command;
  if (environment(std::string("OMPI_MCA_") + kMpirunKillTimeout)) return command;
  const bool set_already = std::any_of(command.begin(), command.end(), [](const std::string& word) {
    return word.find(kMpirunKillTimeout) != std::string::npos;
  });
  if (set_already) return command;
  command.insert(command.begin() + 1, {"--mca", kMpirunKillTimeout, std::to_string(seconds)});
  return command;
}

bool is_rank_of_launcher(int pid, std::string_view endpoint) {
  if (pid < 2) return false;  // 0 and -1 would name process groups or every process; 1 is init
  std::ifstream file("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  if (!file) return false;
  // NUL-separated NAME=VALUE entries, as the process was started with.
  const std::string wanted = std::string(kLauncherVariable) + "=" + std::string(endpoint);
  std::string entry;
  while (std::getline(file, entry, '\0')) {
    if (entry == wanted) return true;
  }
  return false;
}

StopDelivery plan_stop_delivery(const std::vector<RankRecord>& ranks, int world_size, std::string_view this_host,
                                JobCommand command, int signal, const std::function<bool(int pid)>& is_our_rank) {
  StopDelivery delivery;
  bool every_rank_reached = world_size > 0 && ranks.size() == static_cast<size_t>(world_size);
  for (const RankRecord& record : ranks) {
    if (record.state != RankState::running && record.state != RankState::silent) continue;  // ended: nothing to stop
    if (record.host == this_host && is_our_rank(record.pid)) {
      delivery.pids.push_back(record.pid);
    } else {
      every_rank_reached = false;
    }
  }
  if (!every_rank_reached) {
    delivery.command_signal = command == JobCommand::mpirun ? SIGUSR1 : command == JobCommand::srun ? SIGTERM : signal;
  }
  return delivery;
}

}  // namespace tessera::dist
