// Launch: detect_launch over fake environments (mpirun, Slurm, torchrun,
// their precedence, every malformed value and its message), dist::init in
// local mode, and dist::world() inside and outside a distributed context.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "dist/init.h"
#include "dist/launch/launch_environment.h"
#include "tensor/ops.h"
#include "tests/dist/fake_environment.h"

using namespace tessera;
using namespace tessera::dist;
using tessera::test::fake_environment;
namespace ops = tessera::ops;

namespace {

using Variables = std::map<std::string, std::string>;

LaunchInfo detect(const Variables& variables) { return detect_launch(fake_environment(variables)); }

// Sets process environment variables for one scope (dist::init reads the real
// environment), restoring the previous values after.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const Variables& variables) {
    for (const auto& [name, value] : variables) {
      previous_[name] = process_environment(name);
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : previous_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> previous_;
};

}  // namespace

TEST_CASE("launch: launcher names") {
  CHECK(launcher_name(Launcher::local) == "local");
  CHECK(launcher_name(Launcher::mpirun) == "mpirun");
  CHECK(launcher_name(Launcher::slurm) == "slurm");
  CHECK(launcher_name(Launcher::torchrun) == "torchrun");
}

TEST_CASE("launch: no launcher variables means the local backend") {
  LaunchInfo info = detect({{"HOME", "/root"}});
  CHECK(info.launcher == Launcher::local);
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.local_world_size == 1);
}

TEST_CASE("launch: mpirun's OMPI_COMM_WORLD_* variables") {
  LaunchInfo info = detect({{"OMPI_COMM_WORLD_RANK", "5"},
                            {"OMPI_COMM_WORLD_SIZE", "8"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(info.launcher == Launcher::mpirun);
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
}

TEST_CASE("launch: Slurm's variables, with the local size from the tasks-per-node list") {
  SUBCASE("SLURM_NTASKS_PER_NODE wins over SLURM_TASKS_PER_NODE") {
    LaunchInfo info = detect({{"SLURM_PROCID", "3"},
                              {"SLURM_NTASKS", "6"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_NTASKS_PER_NODE", "2"},
                              {"SLURM_TASKS_PER_NODE", "3(x2)"}});
    CHECK(info.launcher == Launcher::slurm);
    CHECK(info.rank == 3);
    CHECK(info.world_size == 6);
    CHECK(info.local_rank == 1);
    CHECK(info.local_world_size == 2);
  }
  SUBCASE("SLURM_TASKS_PER_NODE is read at this node's entry") {
    // 3 tasks on each of nodes 0 and 1, then 2 tasks on node 2.
    auto local_size_on = [](std::optional<std::string> node) {
      Variables variables = {
          {"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "3(x2),2"}};
      if (node) variables.emplace("SLURM_NODEID", *node);
      return detect(variables).local_world_size;
    };
    CHECK(local_size_on("2") == 2);
    CHECK(local_size_on("1") == 3);
    CHECK(local_size_on(std::nullopt) == 3);  // no SLURM_NODEID: the first entry
  }
  SUBCASE("no tasks-per-node variable: one task on this node") {
    LaunchInfo info = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
    CHECK(info.local_rank == 0);
    CHECK(info.local_world_size == 1);
  }
  SUBCASE("SLURM_NTASKS without SLURM_PROCID is a batch script, not an srun task") {
    CHECK(detect({{"SLURM_NTASKS", "4"}}).launcher == Launcher::local);
  }
}

TEST_CASE("launch: torchrun-style RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE") {
  LaunchInfo info = detect({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
  CHECK(info.launcher == Launcher::torchrun);
  CHECK(info.rank == 2);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 0);
  CHECK(info.local_world_size == 2);
}

TEST_CASE("launch: mpirun beats Slurm beats torchrun") {
  const Variables torchrun = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  Variables slurm = torchrun;
  slurm.insert({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}});
  Variables mpirun = slurm;
  mpirun.insert({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});

  CHECK(detect(torchrun).launcher == Launcher::torchrun);
  LaunchInfo under_slurm = detect(slurm);
  CHECK(under_slurm.launcher == Launcher::slurm);
  CHECK(under_slurm.rank == 2);
  LaunchInfo under_mpirun = detect(mpirun);
  CHECK(under_mpirun.launcher == Launcher::mpirun);
  CHECK(under_mpirun.rank == 3);
  CHECK(under_mpirun.world_size == 4);
}

TEST_CASE("launch: malformed and inconsistent values name the variable") {
  auto message_of = [](const Variables& variables) {
    try {
      detect(variables);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  CHECK(message_of({{"OMPI_COMM_WORLD_RANK", "abc"}, {"OMPI_COMM_WORLD_SIZE", "2"}}) ==
        "dist::detect_launch: OMPI_COMM_WORLD_RANK='abc' is not an integer");
  CHECK(message_of({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}) == "dist::detect_launch: RANK='1x' is not an integer");
  CHECK(message_of({{"RANK", ""}, {"WORLD_SIZE", "2"}}) == "dist::detect_launch: RANK='' is not an integer");
  CHECK(message_of({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}) == "dist::detect_launch: RANK=' 1' is not an integer");
  CHECK(message_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}) ==
        "dist::detect_launch: WORLD_SIZE='99999999999' is not an integer");
  CHECK(message_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}) == "dist::detect_launch: RANK=-1 must be at least 0");
  CHECK(message_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}) == "dist::detect_launch: WORLD_SIZE=0 must be at least 1");
  CHECK(message_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}) ==
        "dist::detect_launch: RANK=4 is outside [0, 4) given by WORLD_SIZE");
  CHECK(message_of({{"RANK", "0"}}) ==
        "dist::detect_launch: RANK is set but WORLD_SIZE is not; the torchrun launcher sets both");
  CHECK(message_of({{"OMPI_COMM_WORLD_SIZE", "2"}}) ==
        "dist::detect_launch: OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not; the mpirun launcher sets "
        "both");
  CHECK(message_of({{"SLURM_PROCID", "0"}}) ==
        "dist::detect_launch: SLURM_PROCID is set but SLURM_NTASKS is not; the slurm launcher sets both");
  CHECK(message_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}) ==
        "dist::detect_launch: LOCAL_RANK=2 is outside [0, 2) given by LOCAL_WORLD_SIZE");
  CHECK(message_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}}) ==
        "dist::detect_launch: local size LOCAL_WORLD_SIZE=8 exceeds the world size WORLD_SIZE=4");
  CHECK(message_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}) ==
        "dist::detect_launch: LOCAL_RANK=1 is set but the local size (LOCAL_WORLD_SIZE) is not");
  CHECK(message_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x"}}) ==
        "dist::detect_launch: SLURM_TASKS_PER_NODE='2(x' is malformed");
  CHECK(message_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(xa)"}}) ==
        "dist::detect_launch: SLURM_TASKS_PER_NODE='2(xa)' is malformed");
  CHECK(message_of(
            {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NODEID", "2"}}) ==
        "dist::detect_launch: SLURM_TASKS_PER_NODE='2(x2)' lists 2 nodes; SLURM_NODEID=2 is not among them");
  CHECK(
      message_of(
          {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}) ==
      "dist::detect_launch: SLURM_LOCALID=3 is outside [0, 2) given by SLURM_NTASKS_PER_NODE / "
      "SLURM_TASKS_PER_NODE");
}

TEST_CASE("launch: dist::init without a launcher runs the local backend with world() on every rank") {
  REQUIRE(detect_launch().launcher == Launcher::local);  // this test needs a plain process
  std::mutex mutex;
  std::vector<int> ranks_seen;
  std::vector<double> sums;
  InitOptions options;
  options.local_ranks = 3;
  init(options, [&](const ProcessGroupPtr& group) {
    const ProcessGroupPtr& current = world();
    Tensor value = ops::full({2}, current->rank() + 1.0);
    current->all_reduce(value, ReduceOp::sum);
    std::lock_guard lock(mutex);
    ranks_seen.push_back(group->rank());
    CHECK(current == group);
    CHECK(current->size() == 3);
    CHECK(current->backend_name() == "local");
    sums.push_back(value.to_vector<double>()[1]);
  });
  std::sort(ranks_seen.begin(), ranks_seen.end());
  CHECK(ranks_seen == std::vector<int>{0, 1, 2});
  CHECK(sums == std::vector<double>{6.0, 6.0, 6.0});
}

TEST_CASE("launch: dist::init rethrows a rank's error and rejects no ranks") {
  REQUIRE(detect_launch().launcher == Launcher::local);
  InitOptions options;
  options.local_ranks = 2;
  CHECK_THROWS_WITH_AS(init(options,
                            [](const ProcessGroupPtr& group) {
                              if (group->rank() == 1) fail("rank 1 gave up");
                            }),
                       doctest::Contains("rank 1 gave up"), Error);
  options.local_ranks = 0;
  CHECK_THROWS_WITH_AS(init(options, [](const ProcessGroupPtr&) {}),
                       "dist::init: local_ranks must be at least 1, got 0", Error);
}

TEST_CASE("launch: torchrun-style variables without an MPI launcher") {
  SUBCASE("a world of several processes is refused with how to start it") {
    ScopedEnvironment environment({{"RANK", "1"}, {"WORLD_SIZE", "4"}});
    bool ran = false;
    CHECK_THROWS_WITH_AS(
        init({}, [&](const ProcessGroupPtr&) { ran = true; }),
        "dist::init: torchrun-style variables say this is rank 1 of 4 (RANK, WORLD_SIZE), but no MPI launcher "
        "started this process; tessera's multi-process backend is MPI, so start the job with `mpirun -np 4` (or "
        "srun under Slurm) instead",
        Error);
    CHECK_FALSE(ran);
  }
  SUBCASE("a world of one process runs as one local rank") {
    ScopedEnvironment environment({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
    InitOptions options;
    options.local_ranks = 4;  // ignored: the launcher said one process
    std::atomic<int> calls = 0;
    init(options, [&](const ProcessGroupPtr& group) {
      CHECK(group->size() == 1);
      ++calls;
    });
    CHECK(calls == 1);
  }
}

TEST_CASE("launch: TESSERA_DIST_TIMEOUT_S is a plain decimal number of seconds; anything else is refused by name") {
  const std::map<std::string, int64_t> accepted{
      {"5", 5000}, {"0.5", 500}, {"30", 30000}, {"0.001", 1}, {"604800", 604800000}, {"007.250", 7250}};
  for (const auto& [value, milliseconds] : accepted) {
    CAPTURE(value);
    const ScopedEnvironment environment(Variables{{"TESSERA_DIST_TIMEOUT_S", value}});
    CHECK(ProcessGroupOptions::from_environment().timeout == std::chrono::milliseconds(milliseconds));
  }
  for (const char* value : {" 5", "5 ", "0x10", "1e3", "+5", "-1", "5.", ".5", "inf", "nan", "", "5s", "1,5", "0",
                            "0.0001", "604801", "99999999999999999999999999999999999999"}) {
    CAPTURE(value);
    const ScopedEnvironment environment(Variables{{"TESSERA_DIST_TIMEOUT_S", value}});
    CHECK_THROWS_WITH_AS(ProcessGroupOptions::from_environment(),
                         (std::string("TESSERA_DIST_TIMEOUT_S: expected seconds in [0.001, 604800] (a week), got '") +
                          value + "'; write a plain decimal number such as 30 or 0.5")
                             .c_str(),
                         Error);
  }
}

TEST_CASE("launch: world() outside a distributed context throws") {
  CHECK_THROWS_WITH_AS(
      world(), "dist::world(): no distributed context on this thread; call inside dist::init or dist::run_local",
      Error);
  set_world(nullptr);
  CHECK_THROWS_AS(world(), Error);
}
