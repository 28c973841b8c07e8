// Stop forwarding (contract in stop_forwarding.h): a rank proven by its
// environment, and the plan.
#include "dist/launch/stop_forwarding.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>

#include "dist/launch/lifeline.h"

namespace tessera::dist {

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
