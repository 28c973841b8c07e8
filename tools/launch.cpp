// `launch`: runs a multi-process tessera job (mpirun, srun or any command
// that starts ranks) and supervises it through the ranks' lifelines
// (dist/launch/lifeline.h, dist/launch/job_supervisor.h):
//   - it names each rank's host and pid as the rank joins, and the first
//     thing that went wrong: a rank killed, a rank's error, a rank or a
//     whole host gone silent;
//   - once a rank has failed or was lost, it gives the job --grace-s to end
//     by itself (MPI_Abort, mpirun's own teardown), then sends SIGTERM to
//     the command's process group and, 5 s later, SIGKILL: the job always
//     ends, also when mpirun would wait for a host it cannot reach;
//   - a SIGTERM, SIGINT or SIGHUP to it is a stop: it passes it on to the
//     ranks (dist/launch/stop_forwarding.h), gives them --stop-grace-s to
//     save and end, and only then tears the job down as above; a SIGINT
//     after that kills the job at once;
//   - it ends with one line per host, saying how each rank ended.
// Usage: launch [--heartbeat-timeout-s S] [--grace-s S] [--stop-grace-s S] [--address A] [--port P] -- COMMAND...
// The ranks find the launcher by TESSERA_LAUNCHER=address:port and prove
// they belong to the job by TESSERA_JOB_SECRET (the one in the launcher's
// environment, else a new random one), which it sets and, for mpirun,
// forwards with -x; a connection without the secret changes nothing.
// It listens only on --address. By default that is loopback when every rank
// runs on this host (a program or script, or mpirun naming no hosts outside
// a batch allocation: dist/launch/launch_command.h has the rule), else this
// host's first IPv4 address that is up and not loopback, the one the ranks'
// hosts must reach. Exit status: the command's (128 + N for signal N), 1
// when it exited 0 but a rank failed or was lost, 2 for a usage error; for
// mpirun, 75 when every rank stopped on request (train's status for a
// stop), whatever mpirun's teardown made of it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dist/launch/job_secret.h"
#include "dist/launch/job_supervisor.h"
#include "dist/launch/launch_command.h"
#include "dist/launch/lifeline.h"
#include "dist/launch/stop_forwarding.h"
#include "train/flag_checks.h"
#include "train/graceful_stop.h"

namespace {

using tessera::dist::Clock;
using tessera::dist::JobCommand;
using namespace std::chrono_literals;

std::atomic<int> pending_signal{0};
void remember_signal(int signal) { pending_signal.store(signal); }

void say(const std::string& line) {
  std::fprintf(stderr, "tessera launch: %s\n", line.c_str());
  std::fflush(stderr);
}

std::string program_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

pid_t start(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    say(fmt::format("fork failed: {}", std::strerror(errno)));
    std::exit(1);
  }
  if (child == 0) {
    ::setpgid(0, 0);  // its own process group, so that teardown reaches all of it
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "tessera launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
    std::_Exit(127);
  }
  ::setpgid(child, child);  // also here: whichever of the two runs first
  return child;
}

// mpirun's teardown sends SIGTERM one kill timeout after it began, SIGKILL
// after two: half the stop's grace leaves the ranks, signalled together
// with mpirun (inside a batch allocation: stop_forwarding.h), the whole grace.
int mpirun_kill_timeout_s(double stop_grace_s) { return std::max(1, static_cast<int>(std::ceil(stop_grace_s / 2))); }

// Passes a stop on to the ranks (dist/launch/stop_forwarding.h) and says how.
void pass_stop_on(int signal, const tessera::dist::JobSupervisor& supervisor, JobCommand kind, pid_t child,
                  const std::string& program, const std::string& endpoint, double stop_grace_s) {
  const tessera::dist::StopDelivery delivery =
      tessera::dist::plan_stop_delivery(supervisor.ranks(), supervisor.world_size(), tessera::dist::host_name(), kind,
                                        signal, [&](int pid) {
                                          return pid != child && tessera::dist::is_rank_of_launcher(pid, endpoint);
                                        });
  for (const int pid : delivery.pids) ::kill(pid, SIGTERM);
  if (delivery.command_signal != 0) ::kill(child, delivery.command_signal);
  std::vector<std::string> ways;
  if (!delivery.pids.empty()) {
    ways.push_back(fmt::format("SIGTERM to {} rank{} on this host", delivery.pids.size(),
                               delivery.pids.size() == 1 ? "" : "s"));
  }
  if (delivery.command_signal != 0) {
    ways.push_back(fmt::format("SIG{} to {}{}", sigabbrev_np(delivery.command_signal), program,
                               delivery.pids.empty() ? "" : " for the others"));
  }
  say(fmt::format("SIG{}: stopping the job ({}); the ranks have {:g} s to save and end (--stop-grace-s)",
                  sigabbrev_np(signal), fmt::join(ways, ", "), stop_grace_s));
}

int exit_status_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera launch: runs a multi-process job and supervises its ranks (docs/distributed.md)"};
  double heartbeat_timeout_s = 10;
  double grace_s = 30;
  double stop_grace_s = 60;
  std::string address;
  int port = 0;
  std::vector<std::string> command;
  // A day at most: a bound that keeps the conversion to milliseconds exact.
  constexpr double kLongestWait_s = 86400;
  app.add_option("--heartbeat-timeout-s", heartbeat_timeout_s, "a rank not heard for this long is reported silent")
      ->check(tessera::train::number_in(0, kLongestWait_s, /*min_exclusive=*/true));
  app.add_option("--grace-s", grace_s, "after a rank failed or was lost, how long the job may take to end itself")
      ->check(tessera::train::number_in(0, kLongestWait_s));
  app.add_option("--stop-grace-s", stop_grace_s,
                 "after a stop (SIGTERM, SIGINT, SIGHUP) reached the ranks, how long they have to save and end")
      ->check(tessera::train::number_in(0, kLongestWait_s));
  app.add_option("--address", address,
                 "the address the launcher listens on and ranks reach it at (default: 127.0.0.1 for a job on this "
                 "host, else this host's first external IPv4)");
  app.add_option("--port", port, "the lifelines' port (default: one the system picks)")
      ->check(tessera::train::integer_in(0, 65535));
  app.add_option("command", command, "the job: mpirun ..., srun ..., or a program")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return tessera::train::exit_after_parse_error(app, error, std::cout, std::cerr);
  }

  std::optional<tessera::dist::JobSupervisor> supervisor;
  std::string secret;
  try {
    secret = tessera::dist::job_secret_from().value_or(tessera::dist::new_job_secret());
    if (address.empty()) address = tessera::dist::default_launcher_address(command);
    supervisor.emplace(tessera::dist::JobSupervisorOptions{
        .address = address,
        .port = port,
        .job_secret = secret,
        .heartbeat_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::duration<double>(heartbeat_timeout_s))});
  } catch (const std::exception& error) {
    say(error.what());  // an address or port it cannot have, or a malformed secret: each names itself
    return tessera::train::kUsageExitCode;
  }
  const std::string endpoint = tessera::dist::endpoint_name(address, supervisor->port());
  ::setenv(tessera::dist::kLauncherVariable, endpoint.c_str(), 1);
  ::setenv(tessera::dist::kJobSecretVariable, secret.c_str(), 1);
  ::signal(SIGINT, remember_signal);
  ::signal(SIGTERM, remember_signal);
  ::signal(SIGHUP, remember_signal);

  const Clock::time_point started = Clock::now();
  const JobCommand kind = tessera::dist::job_command_of(command);
  const pid_t child = start(tessera::dist::with_mpirun_kill_timeout(
      tessera::dist::with_variables_forwarded(command,
                                              {tessera::dist::kLauncherVariable, tessera::dist::kJobSecretVariable}),
      mpirun_kill_timeout_s(stop_grace_s)));
  say(fmt::format("lifelines at {}; running {}", endpoint, fmt::join(command, " ")));

  std::optional<Clock::time_point> failed_at, stop_at, terminated_at, every_rank_ended_at;
  bool killed = false;
  int status = 0;
  for (;;) {
    for (const std::string& event : supervisor->poll(100ms)) say(event);
    const Clock::time_point now = Clock::now();
    if (const int signal = pending_signal.exchange(0)) {
      if (!stop_at && !terminated_at) {
        pass_stop_on(signal, *supervisor, kind, child, program_name(command.front()), endpoint, stop_grace_s);
        stop_at = now;
      } else if (signal == SIGINT || terminated_at) {
        say(fmt::format("SIG{} again: SIGKILL to the job's process group", sigabbrev_np(signal)));
        ::kill(-child, SIGKILL);
        killed = true;
        if (!terminated_at) terminated_at = now;
      } else {
        // Schedulers repeat SIGTERM (Slurm signals every process of a job),
        // and follow with SIGKILL when they will not wait.
        say(fmt::format("SIG{}: the ranks are already stopping (a SIGINT kills the job at once)",
                        sigabbrev_np(signal)));
      }
    }
    if (::waitpid(child, &status, WNOHANG) == child) break;
    if (!failed_at && supervisor->job_failed()) failed_at = now;
    if (!every_rank_ended_at && supervisor->every_rank_ended()) every_rank_ended_at = now;
    if (failed_at && !terminated_at && now - *failed_at > std::chrono::duration<double>(grace_s)) {
      say(fmt::format("the job did not end within {:g} s of the failure: SIGTERM to its process group", grace_s));
      ::kill(-child, SIGTERM);
      terminated_at = now;
    }
    if (stop_at && !terminated_at && !every_rank_ended_at &&
        now - *stop_at > std::chrono::duration<double>(stop_grace_s)) {
      say(fmt::format("the job did not end within {:g} s of the stop: SIGTERM to its process group", stop_grace_s));
      ::kill(-child, SIGTERM);
      terminated_at = now;
    }
    // With every rank ended, mpirun may still be in its teardown: it sleeps
    // its kill timeout (at most half the stop's grace) twice before it
    // forwards the ranks' last output and exits. Past that it is stuck.
    if (kind == JobCommand::mpirun && every_rank_ended_at && !terminated_at &&
        now - *every_rank_ended_at > std::chrono::duration<double>(stop_grace_s) + 3s) {
      say(fmt::format("every rank ended {:g} s ago, but mpirun is still running: SIGTERM to its process group",
                      stop_grace_s + 3));
      ::kill(-child, SIGTERM);
      terminated_at = now;
    }
    if (terminated_at && !killed && now - *terminated_at > 5s) {
      say("still running 5 s after SIGTERM: SIGKILL to its process group");
      ::kill(-child, SIGKILL);
      killed = true;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  say(fmt::format("{} {} after {:.1f} s", program_name(command.front()), describe_status(status), seconds));

  // The ranks' last words arrive after their launcher ends: read them for a
  // moment, then take the lines still open and quiet for silent.
  const Clock::time_point drain_until = Clock::now() + 3s;
  while (supervisor->open_lifelines() > 0 && Clock::now() < drain_until) {
    for (const std::string& event : supervisor->poll(100ms)) say(event);
  }
  for (const std::string& event : supervisor->settle(2s)) say(event);

  const std::string cause = supervisor->root_cause();
  if (!cause.empty()) say("first failure: " + cause);
  if (supervisor->job_stopped()) say("the job stopped on request: every rank ended its graceful stop");
  for (const std::string& line : supervisor->summary()) say(line);
  // mpirun's status after a stop is its teardown's (1 after a SIGTERM to it).
  if (kind == JobCommand::mpirun && supervisor->job_stopped()) return tessera::train::kStoppedExitCode;
  const int exit_status = exit_status_of(status);
  if (exit_status == 0 && supervisor->job_failed()) return 1;
  return exit_status;
}
