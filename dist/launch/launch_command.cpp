// What tools/launch learns from the command it runs (contract in
// launch_command.h). The rule is deliberately blunt: a word that might name
// hosts counts as naming them, since a wrong "remote" only widens the listen.
#include "dist/launch/launch_command.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <string_view>

namespace tessera::dist {
namespace {

std::string_view program_name(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// "mpirun" or "mpirun.openmpi" (Debian's alternatives name it so).
bool is_program(std::string_view path, std::string_view name) {
  const std::string_view program = program_name(path);
  return program == name || (program.starts_with(name) && program.size() > name.size() && program[name.size()] == '.');
}

bool is_mpirun(std::string_view path) {
  return is_program(path, "mpirun") || is_program(path, "mpiexec") || is_program(path, "orterun");
}

// mpirun's options that name hosts, without their dashes (one or two of
// them, with or without "=value").
constexpr std::array<std::string_view, 10> kHostOptions = {
    "H", "host", "hostfile", "machinefile", "default-hostfile", "rankfile", "rf", "app", "add-host", "add-hostfile"};

bool names_hosts(std::string_view word) {
  if (!word.starts_with('-')) return false;
  word.remove_prefix(word.starts_with("--") ? 2 : 1);
  word = word.substr(0, word.find('='));
  return std::find(kHostOptions.begin(), kHostOptions.end(), word) != kHostOptions.end();
}

// Set by the schedulers that signal every process of a job and hand mpirun
// its hosts: Slurm, PBS, Grid Engine, LSF.
constexpr std::array<const char*, 4> kAllocationVariables = {"SLURM_JOB_ID", "PBS_NODEFILE", "PE_HOSTFILE",
                                                             "LSB_MCPU_HOSTS"};
// A default hostfile set through an MCA parameter (which "--mca
// orte_default_hostfile FILE" on the command line sets too).
constexpr std::array<const char*, 2> kHostfileVariables = {"OMPI_MCA_orte_default_hostfile",
                                                           "PRTE_MCA_prte_default_hostfile"};

bool any_set(const auto& variables, const EnvironmentLookup& environment) {
  return std::any_of(variables.begin(), variables.end(),
                     [&](const char* variable) { return environment(variable).has_value(); });
}

}  // namespace

JobCommand job_command_of(const std::vector<std::string>& command) {
  if (command.empty()) return JobCommand::other;
  if (is_mpirun(command.front())) return JobCommand::mpirun;
  return is_program(command.front(), "srun") ? JobCommand::srun : JobCommand::other;
}

bool in_batch_allocation(const EnvironmentLookup& environment) { return any_set(kAllocationVariables, environment); }

std::vector<std::string> with_variables_forwarded(std::vector<std::string> command,
                                                  const std::vector<std::string>& variables) {
  if (command.empty() || !is_mpirun(command.front())) return command;
  std::vector<std::string> flags;
  for (const std::string& variable : variables) {
    flags.push_back("-x");
    flags.push_back(variable);
  }
  command.insert(command.begin() + 1, flags.begin(), flags.end());
  return command;
}

bool job_stays_on_this_host(const std::vector<std::string>& command, const EnvironmentLookup& environment) {
  if (command.empty()) return true;
  if (is_program(command.front(), "srun")) return false;
  if (!is_mpirun(command.front())) return true;
  // Every word, the program's own included: where mpirun's options end
  // depends on which of them take values.
  const bool hosts_named = std::any_of(command.begin() + 1, command.end(), [](const std::string& word) {
    return names_hosts(word) || word.find("default_hostfile") != std::string::npos;
  });
  const bool hosts_elsewhere = in_batch_allocation(environment) || any_set(kHostfileVariables, environment);
  return !hosts_named && !hosts_elsewhere;
}

std::optional<std::string> first_external_ipv4() {
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (const ifaddrs* entry = interfaces; entry != nullptr && !found; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if (!(entry->ifa_flags & IFF_UP) || (entry->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (::inet_ntop(AF_INET, &address->sin_addr, text, sizeof text) != nullptr) found = text;
  }
  ::freeifaddrs(interfaces);
  return found;
}

std::string default_launcher_address(const std::vector<std::string>& command, const EnvironmentLookup& environment) {
  if (job_stays_on_this_host(command, environment)) return "127.0.0.1";
  return first_external_ipv4().value_or("127.0.0.1");
}

}  // namespace tessera::dist
