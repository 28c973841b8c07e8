// What tools/launch learns from the command it runs: which variables the
// command must be told to pass on to its ranks, and whether every rank it
// starts runs on this host, which decides where the launcher listens
// (loopback then, so that no other host can even reach its port).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dist/launch/launch_environment.h"

namespace tessera::dist {

enum class JobCommand { mpirun, srun, other };
// What the command is, by its program's name: mpirun (also mpiexec, orterun
// and Debian's mpirun.openmpi), srun, or anything else.
JobCommand job_command_of(const std::vector<std::string>& command);

// Whether this process runs inside a batch allocation: SLURM_JOB_ID,
// PBS_NODEFILE, PE_HOSTFILE (Grid Engine) or LSB_MCPU_HOSTS (LSF) is set.
// The schedulers that set them signal every process of a job together, and
// mpirun takes its hosts from them.
bool in_batch_allocation(const EnvironmentLookup& environment = process_environment);

// The command with `variables` forwarded to its ranks: mpirun (mpiexec,
// orterun, mpirun.openmpi) starts remote ranks with its own environment, so
// it gets "-x NAME" for each; srun and a program pass on the environment by
// themselves and are returned as they are.
std::vector<std::string> with_variables_forwarded(std::vector<std::string> command,
                                                  const std::vector<std::string>& variables);

// Whether every rank `command` starts runs on this host. A program, or a
// script, does (one that starts ranks elsewhere itself needs --address).
// mpirun does unless a word of the command names hosts (-H, --host,
// --hostfile, --machinefile, --default-hostfile, --rankfile, --app, in any
// spelling) or it runs inside a batch allocation (SLURM_JOB_ID,
// PBS_NODEFILE, PE_HOSTFILE, LSB_MCPU_HOSTS set), where it starts ranks on
// the allocation's hosts. srun never does: its tasks run on the
// allocation's nodes, which a login node is not among. An answer of "no" when
// every rank is local only costs a wider listen: the job secret still guards it.
bool job_stays_on_this_host(const std::vector<std::string>& command,
                            const EnvironmentLookup& environment = process_environment);

// Where the launcher listens by default: "127.0.0.1" for a job on this
// host alone, else this host's first IPv4 address that is up and not
// loopback (the one the ranks' hosts must reach; "127.0.0.1" if it has none).
std::string default_launcher_address(const std::vector<std::string>& command,
                                     const EnvironmentLookup& environment = process_environment);

// The first IPv4 address of this host that is up and not loopback, if any.
std::optional<std::string> first_external_ipv4();

}  // namespace tessera::dist
