// How tools/launch passes a stop (SIGTERM, SIGINT or SIGHUP to the launcher)
// on to a job's ranks, whose graceful stop (train/graceful_stop.h) saves the
// last finished step, and how it keeps mpirun from killing them first:
//   - a rank on this host gets SIGTERM from the launcher itself, at the pid
//     its hello named, once /proc/<pid>/environ shows this launcher's
//     TESSERA_LAUNCHER: a forged hello or a reused pid is never signalled;
//   - the ranks it cannot signal so (on other hosts, not heard from yet) get
//     the stop through the command: mpirun gets SIGUSR1, which it passes on
//     to every rank at once (SIGTERM it takes as an order to tear the job
//     down: SIGTERM to the ranks only after its odls_base_sigkill_timeout,
//     SIGKILL after twice that); srun gets SIGTERM, which it passes on; any
//     other command gets the launcher's own signal;
//   - inside a batch allocation, where the scheduler's SIGTERM reaches every
//     process of the job together (Slurm's scancel, a preemption or a time
//     limit), mpirun and its daemons included, mpirun is started with
//     odls_base_sigkill_timeout at half the stop's grace (OpenMPI's default
//     is 1 s), so that its teardown leaves the ranks the grace to save.
//     Elsewhere the default stands: it is also how long a failed job's
//     teardown sleeps, twice.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/launch/job_supervisor.h"
#include "dist/launch/launch_command.h"
#include "dist/launch/launch_environment.h"

namespace tessera::dist {

// OpenMPI's MCA parameter for how long its teardown waits after SIGCONT
// before SIGTERM, and again before SIGKILL.
inline constexpr const char* kMpirunKillTimeout = "odls_base_sigkill_timeout";

// Inside a batch allocation, the command with mpirun's kill timeout set to
// `seconds` ("--mca odls_base_sigkill_timeout N" after the program); as it
// is elsewhere, when it is not mpirun, or when the command or
// OMPI_MCA_odls_base_sigkill_timeout already sets the parameter (the user's
// choice stands).
std::vector<std::string> with_mpirun_kill_timeout(std::vector<std::string> command, int seconds,
                                                  const EnvironmentLookup& environment = process_environment);

// Whether the process `pid` of this host was started with
// TESSERA_LAUNCHER=`endpoint` in its environment; false for a pid below 2,
// one that is gone, or one whose environment cannot be read.
bool is_rank_of_launcher(int pid, std::string_view endpoint);

struct StopDelivery {
  std::vector<int> pids;   // ranks of this host, to get SIGTERM from the launcher
  int command_signal = 0;  // for the command, to reach the others; 0 when every rank is among `pids`
};

// Who gets the stop: every rank still running on `this_host` for which
// `is_our_rank(pid)` holds directly; when that is not every rank of the
// world (some on other hosts, or not heard from yet), the command too, with
// SIGUSR1 for mpirun, SIGTERM for srun and `signal` for anything else.
StopDelivery plan_stop_delivery(const std::vector<RankRecord>& ranks, int world_size, std::string_view this_host,
                                JobCommand command, int signal, const std::function<bool(int pid)>& is_our_rank);

}  // namespace tessera::dist
