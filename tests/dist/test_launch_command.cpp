// What tools/launch learns from the command it runs (dist/launch/launch_command.h):
// the variables mpirun must be told to forward, and whether every rank runs
// on this host, which makes the launcher listen on loopback.
#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch/launch_command.h"
#include "tests/dist/fake_environment.h"

using namespace tessera::dist;
using tessera::test::fake_environment;

namespace {

using Command = std::vector<std::string>;

const EnvironmentLookup no_variables = fake_environment({});

}  // namespace

TEST_CASE("mpirun is told to forward the launcher's variables; srun and a program pass them on by themselves") {
  const std::vector<std::string> variables = {"TESSERA_LAUNCHER", "TESSERA_JOB_SECRET"};
  CHECK(with_variables_forwarded({"mpirun", "-np", "2", "train"}, variables) ==
        Command{"mpirun", "-x", "TESSERA_LAUNCHER", "-x", "TESSERA_JOB_SECRET", "-np", "2", "train"});
  CHECK(with_variables_forwarded({"/usr/bin/mpirun.openmpi", "train"}, variables) ==
        Command{"/usr/bin/mpirun.openmpi", "-x", "TESSERA_LAUNCHER", "-x", "TESSERA_JOB_SECRET", "train"});
  CHECK(with_variables_forwarded({"mpiexec", "train"}, variables).size() == 6);
  for (const Command& command : {Command{"srun", "-n", "2", "train"}, Command{"train"}, Command{"mpirunner", "x"}}) {
    CAPTURE(command.front());
    CHECK(with_variables_forwarded(command, variables) == command);
  }
}

TEST_CASE("a program, a script and mpirun naming no hosts keep the job on this host") {
  CHECK(job_stays_on_this_host({"build/examples/gpt/train", "--steps", "10"}, no_variables));
  CHECK(job_stays_on_this_host({"bash", "-c", "exec train"}, no_variables));
  CHECK(job_stays_on_this_host({"mpirun", "--oversubscribe", "-np", "4", "train"}, no_variables));
  CHECK(job_stays_on_this_host({"/usr/bin/mpiexec.openmpi", "-n", "2", "train"}, no_variables));
}

TEST_CASE("mpirun naming hosts, mpirun in a batch allocation, and srun may start ranks elsewhere") {
  for (const Command& command :
       {Command{"mpirun", "--hostfile", "hosts", "train"}, Command{"mpirun", "-hostfile", "hosts", "train"},
        Command{"mpirun", "-H", "a,b", "train"}, Command{"mpirun", "--host=a:2,b:2", "train"},
        Command{"mpiexec", "-machinefile", "m", "train"}, Command{"orterun", "--rankfile", "r", "train"},
        Command{"mpirun", "--app", "appfile"}, Command{"mpirun", "--mca", "orte_default_hostfile", "f", "train"},
        Command{"srun", "-n", "2", "train"}, Command{"/usr/bin/srun", "train"}}) {
    CAPTURE(command[1]);
    CHECK_FALSE(job_stays_on_this_host(command, no_variables));
  }
  for (const char* variable : {"SLURM_JOB_ID", "PBS_NODEFILE", "PE_HOSTFILE", "LSB_MCPU_HOSTS",
                               "OMPI_MCA_orte_default_hostfile"}) {
    CAPTURE(variable);
    CHECK_FALSE(job_stays_on_this_host({"mpirun", "-np", "2", "train"}, fake_environment({{variable, "x"}})));
    CHECK(job_stays_on_this_host({"train"}, fake_environment({{variable, "x"}})));
  }
}

TEST_CASE("the launcher listens on loopback for a job on this host, else on this host's external address") {
  CHECK(default_launcher_address({"mpirun", "-np", "2", "train"}, no_variables) == "127.0.0.1");
  CHECK(default_launcher_address({"srun", "train"}, no_variables) == first_external_ipv4().value_or("127.0.0.1"));
  if (const std::optional<std::string> external = first_external_ipv4()) {
    CHECK(external->starts_with("127.") == false);
  }
}
