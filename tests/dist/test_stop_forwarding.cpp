// How tools/launch passes a stop on (dist/launch/stop_forwarding.h): which
// ranks it signals itself, what the command gets, mpirun's kill timeout, and
// a rank proven by its environment (a real child process).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch/stop_forwarding.h"

using namespace tessera::dist;

namespace {

RankRecord rank_on(int rank, const std::string& host, RankState state = RankState::running) {
  RankRecord record;
  record.rank = rank;
  record.pid = 4000 + rank;
  record.host = host;
  record.state = state;
  return record;
}

const auto every_pid_ours = [](int) { return true; };

std::optional<std::string> no_environment(const std::string&) { return std::nullopt; }

// A child process started with `environment`, ended with its scope.
class ChildWith {
 public:
  explicit ChildWith(std::vector<std::string> environment) : environment_(std::move(environment)) {
    std::vector<char*> variables;
    for (std::string& entry : environment_) variables.push_back(entry.data());
    variables.push_back(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      char sleep_program[] = "sleep", seconds[] = "60";
      char* arguments[] = {sleep_program, seconds, nullptr};
      ::execve("/bin/sleep", arguments, variables.data());
      ::_exit(127);
    }
  }
  ~ChildWith() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ChildWith(const ChildWith&) = delete;
  ChildWith& operator=(const ChildWith&) = delete;
  int pid() const { return pid_; }

 private:
  std::vector<std::string> environment_;
  int pid_ = -1;
};

// Until the child has exec'd and its environment is in place (exec points
// /proc/<pid>/exe at the new program a moment before it sets the
// environment's bounds), at most 10 s.
bool wait_for_exec(int pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    char target[256] = {};
    const ssize_t length = ::readlink((proc + "/exe").c_str(), target, sizeof target - 1);
    std::ifstream environment(proc + "/environ", std::ios::binary);
    const bool has_environment = environment && environment.peek() != std::ifstream::traits_type::eof();
    if (length > 0 && std::string(target, static_cast<size_t>(length)).ends_with("sleep") && has_environment) {
      return true;
    }
    ::usleep(10'000);
  }
  return false;
}

}  // namespace

TEST_SUITE("dist stop forwarding") {

TEST_CASE("the command's kind comes from its program's name") {
  CHECK(job_command_of({"mpirun", "-np", "2", "train"}) == JobCommand::mpirun);
  CHECK(job_command_of({"/usr/bin/mpiexec", "train"}) == JobCommand::mpirun);
  CHECK(job_command_of({"orterun"}) == JobCommand::mpirun);
  CHECK(job_command_of({"mpirun.openmpi"}) == JobCommand::mpirun);
  CHECK(job_command_of({"srun", "--mpi=pmix", "train"}) == JobCommand::srun);
  CHECK(job_command_of({"bash", "-c", "mpirun"}) == JobCommand::other);
  CHECK(job_command_of({}) == JobCommand::other);
}

TEST_CASE("inside a batch allocation mpirun gets a kill timeout, unless the user set one; elsewhere nothing changes") {
  const auto in_slurm = [](const std::string& name) -> std::optional<std::string> {
    if (name == "SLURM_JOB_ID") return "42";
    return std::nullopt;
  };
  CHECK(in_batch_allocation(in_slurm));
  CHECK_FALSE(in_batch_allocation(no_environment));
  CHECK(with_mpirun_kill_timeout({"mpirun", "-np", "2", "train"}, 30, in_slurm) ==
        std::vector<std::string>{"mpirun", "--mca", "odls_base_sigkill_timeout", "30", "-np", "2", "train"});
  const std::vector<std::string> plain{"mpirun", "train"};
  CHECK(with_mpirun_kill_timeout(plain, 30, no_environment) == plain);
  const std::vector<std::string> set_by_user{"mpirun", "--mca", "odls_base_sigkill_timeout", "5", "train"};
  CHECK(with_mpirun_kill_timeout(set_by_user, 30, in_slurm) == set_by_user);
  CHECK(with_mpirun_kill_timeout(plain, 30, [&](const std::string& name) -> std::optional<std::string> {
          if (name == "OMPI_MCA_odls_base_sigkill_timeout") return "5";
          return in_slurm(name);
        }) == plain);
  const std::vector<std::string> srun{"srun", "train"};
  CHECK(with_mpirun_kill_timeout(srun, 30, in_slurm) == srun);
}

TEST_CASE("ranks of this host that are ours are signalled directly; the command only when some are out of reach") {
  const std::vector<RankRecord> local{rank_on(0, "host-a"), rank_on(1, "host-a")};
  StopDelivery delivery = plan_stop_delivery(local, 2, "host-a", JobCommand::mpirun, SIGTERM, every_pid_ours);
  CHECK(delivery.pids == std::vector<int>{4000, 4001});
  CHECK(delivery.command_signal == 0);

  // A rank on another host: through the command, as it passes a stop on at once.
  const std::vector<RankRecord> spread{rank_on(0, "host-a"), rank_on(1, "host-b")};
  delivery = plan_stop_delivery(spread, 2, "host-a", JobCommand::mpirun, SIGTERM, every_pid_ours);
  CHECK(delivery.pids == std::vector<int>{4000});
  CHECK(delivery.command_signal == SIGUSR1);
  CHECK(plan_stop_delivery(spread, 2, "host-a", JobCommand::srun, SIGINT, every_pid_ours).command_signal == SIGTERM);
  CHECK(plan_stop_delivery(spread, 2, "host-a", JobCommand::other, SIGINT, every_pid_ours).command_signal == SIGINT);

  // A rank not heard from yet, or no world at all: through the command.
  CHECK(plan_stop_delivery(local, 3, "host-a", JobCommand::mpirun, SIGTERM, every_pid_ours).command_signal == SIGUSR1);
  delivery = plan_stop_delivery({}, 0, "host-a", JobCommand::mpirun, SIGTERM, every_pid_ours);
  CHECK(delivery.pids.empty());
  CHECK(delivery.command_signal == SIGUSR1);

  // A pid that is not proven ours is never signalled.
  delivery = plan_stop_delivery(local, 2, "host-a", JobCommand::mpirun, SIGTERM, [](int pid) { return pid == 4001; });
  CHECK(delivery.pids == std::vector<int>{4001});
  CHECK(delivery.command_signal == SIGUSR1);

  // Ranks that have ended need no stop, and are not out of reach.
  const std::vector<RankRecord> one_ended{rank_on(0, "host-a"), rank_on(1, "host-b", RankState::done)};
  delivery = plan_stop_delivery(one_ended, 2, "host-a", JobCommand::mpirun, SIGTERM, every_pid_ours);
  CHECK(delivery.pids == std::vector<int>{4000});
  CHECK(delivery.command_signal == 0);
}

TEST_CASE("a rank is proven by this launcher's TESSERA_LAUNCHER in the environment it was started with") {
  for (const int pid : {-1, 0, 1}) CHECK_FALSE(is_rank_of_launcher(pid, "127.0.0.1:1234"));
  const ChildWith rank({"PATH=/bin", "TESSERA_LAUNCHER=127.0.0.1:1234"});
  REQUIRE(wait_for_exec(rank.pid()));
  CHECK(is_rank_of_launcher(rank.pid(), "127.0.0.1:1234"));
  CHECK_FALSE(is_rank_of_launcher(rank.pid(), "127.0.0.1:123"));  // a whole entry, not a prefix
  CHECK_FALSE(is_rank_of_launcher(rank.pid(), "127.0.0.1:12345"));
  const ChildWith stranger({"TESSERA_LAUNCHER_X=127.0.0.1:1234"});
  REQUIRE(wait_for_exec(stranger.pid()));
  CHECK_FALSE(is_rank_of_launcher(stranger.pid(), "127.0.0.1:1234"));

  int gone = -1;
  {
    const ChildWith ended({"TESSERA_LAUNCHER=127.0.0.1:1234"});
    gone = ended.pid();
  }
  CHECK_FALSE(is_rank_of_launcher(gone, "127.0.0.1:1234"));
}

}  // TEST_SUITE
