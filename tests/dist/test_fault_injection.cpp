// TESSERA_FAULT's plans: what parses and what is refused by name, arrivals
// counted per point and rank, and a collective fault on thread ranks (a
// kill ends the run naming the fault and the collective; a delay changes
// nothing but the time).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>

#include "dist/backends/local_backend.h"
#include "dist/launch/fault_injection.h"
#include "tensor/ops.h"

using namespace tessera;
using dist::Fault;
using dist::FaultAction;
using dist::FaultPoint;

namespace {

// Clears the plan when a test case ends, so none leaks into the next.
struct ClearFaults {
  ~ClearFaults() { dist::set_faults({}); }
};

}  // namespace

TEST_CASE("fault plans: each action at the points that take it, written back as parsed") {
  const std::vector<Fault> faults = dist::parse_faults(
      "kill@collective,rank=2,at=57;delay@collective,rank=1,at=12,seconds=0.5;"
      "fail@checkpoint_write,rank=1,at=3,errno=ENOSPC;corrupt@checkpoint_write,rank=0;kill@checkpoint_commit,at=2;"
      "fail@data,rank=3,at=10,errno=EIO;disconnect@collective,rank=2,at=30");
  REQUIRE(faults.size() == 7);
  CHECK(faults[0].to_string() == "kill@collective,rank=2,at=57");
  CHECK(faults[1].to_string() == "delay@collective,rank=1,at=12,seconds=0.5");
  CHECK(faults[2].to_string() == "fail@checkpoint_write,rank=1,at=3,errno=ENOSPC");
  CHECK(faults[3].to_string() == "corrupt@checkpoint_write,rank=0,at=1");
  CHECK(faults[4].to_string() == "kill@checkpoint_commit,at=2");
  CHECK(!faults[4].rank);
  CHECK(faults[5].to_string() == "fail@data,rank=3,at=10,errno=EIO");
  CHECK(faults[6].to_string() == "disconnect@collective,rank=2,at=30");
  CHECK(dist::parse_faults("").empty());
  CHECK(dist::describe_errno(faults[2].error_number) == "No space left on device (ENOSPC)");
}

TEST_CASE("fault plans: a bad one is refused, naming the fault and what is wrong") {
  auto refused = [](const char* text, const char* says) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(dist::parse_faults(text), doctest::Contains(says), Error);
  };
  refused("kill", "'kill' is not ACTION@POINT[,KEY=VALUE...]");
  refused("explode@collective", "no action 'explode' (kill, delay, fail, corrupt, disconnect)");
  refused("disconnect@checkpoint_commit", "checkpoint_commit cannot disconnect");
  refused("kill@network", "no point 'network' (collective, checkpoint_write, checkpoint_commit, data)");
  refused("kill@data", "data cannot kill");
  refused("fail@collective,errno=EIO", "collective cannot fail");
  refused("kill@checkpoint_write", "checkpoint_write cannot kill");
  refused("kill@collective,rank=-1", "rank=-1 must be an integer >= 0");
  refused("kill@collective,at=0", "at=0 must be an integer >= 1");
  refused("kill@collective,at=x", "at=x must be an integer >= 1");
  refused("kill@collective,seconds=3", "kill takes no key 'seconds'");
  refused("kill@collective,rank", "'rank' is not KEY=VALUE");
  refused("delay@collective,rank=1", "a delay needs seconds=S");
  refused("delay@collective,seconds=-2", "seconds=-2 must be a number in (0, 3600]");
  refused("fail@checkpoint_write", "a fail needs errno=NAME (ENOSPC, EIO, EDQUOT, EROFS, ENOMEM)");
  refused("fail@checkpoint_write,errno=EPERM", "errno=EPERM is not one of ENOSPC");
  refused("kill@collective;oops", "'oops' is not ACTION@POINT");
  // A second value would otherwise win silently over the first.
  refused("kill@collective,rank=1,rank=2", "TESSERA_FAULT: 'kill@collective,rank=1,rank=2': rank is given twice");
  refused("kill@collective,at=3,rank=0,at=4", "at is given twice");
  refused("delay@collective,seconds=1,seconds=2", "seconds is given twice");
  refused("fail@data,errno=EIO,errno=ENOSPC", "errno is given twice");
}

TEST_CASE("fault plans: a rank outside the world is refused as the world starts, naming the fault") {
  ClearFaults clear;
  dist::set_faults(dist::parse_faults("fail@data,errno=EIO;kill@collective,rank=3,at=1000"));
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(dist::run_local(3, [&](const dist::ProcessGroupPtr&) { ran.fetch_add(1); }),
                       "TESSERA_FAULT: 'kill@collective,rank=3,at=1000': rank=3 is outside this world of 3 ranks (0 "
                       "to 2), so it would never fire",
                       Error);
  CHECK(ran.load() == 0);
  CHECK_NOTHROW(dist::check_faults_fit_world(4));
  dist::run_local(4, [&](const dist::ProcessGroupPtr&) { ran.fetch_add(1); });
  CHECK(ran.load() == 4);
  dist::set_faults(dist::parse_faults("fail@data,errno=EIO"));  // no rank: any world
  dist::run_local(1, [&](const dist::ProcessGroupPtr&) { ran.fetch_add(1); });
  CHECK(ran.load() == 5);
}

TEST_CASE("fault plans: arrivals are counted per point and per rank") {
  ClearFaults clear;
  dist::set_faults(dist::parse_faults("kill@collective,rank=1,at=3;kill@checkpoint_commit,at=2"));
  CHECK(!dist::fault_at(FaultPoint::collective, 1));
  CHECK(!dist::fault_at(FaultPoint::collective, 0));  // rank 0's own count
  CHECK(!dist::fault_at(FaultPoint::collective, 1));
  CHECK(!dist::fault_at(FaultPoint::checkpoint_commit, 1));
  const std::optional<Fault> third = dist::fault_at(FaultPoint::collective, 1);
  REQUIRE(third);
  CHECK(third->action == FaultAction::kill);
  CHECK(!dist::fault_at(FaultPoint::collective, 1));    // the 4th: once only
  CHECK(dist::fault_at(FaultPoint::checkpoint_commit, 1));  // no rank given: each rank's 2nd
  CHECK(!dist::fault_at(FaultPoint::checkpoint_commit, 0));
  CHECK(dist::fault_at(FaultPoint::checkpoint_commit, 0));
  dist::set_faults({});
  for (int i = 0; i < 5; ++i) CHECK(!dist::fault_at(FaultPoint::collective, 1));
}

TEST_CASE("a collective fault on thread ranks: a kill ends the run naming it, a delay only delays") {
  ClearFaults clear;
  auto three_all_reduces = [](const dist::ProcessGroupPtr& group) {
    Tensor value = ops::full({4}, static_cast<double>(group->rank() + 1));
    for (int i = 0; i < 3; ++i) group->all_reduce(value);
    return value.to_vector<float>();
  };
  dist::set_faults(dist::parse_faults("kill@collective,rank=1,at=3"));
  CHECK_THROWS_WITH_AS(dist::run_local(3, [&](const dist::ProcessGroupPtr& group) { three_all_reduces(group); }),
                       doctest::Contains("injected fault kill@collective,rank=1,at=3: the rank died at world rank 1's "
                                         "all_reduce #2 on group 'world'"),
                       dist::InjectedFault);

  // Threads have no connections to drop: a disconnect ends the rank as a kill does.
  dist::set_faults(dist::parse_faults("disconnect@collective,rank=2,at=1"));
  CHECK_THROWS_WITH_AS(dist::run_local(3, [&](const dist::ProcessGroupPtr& group) { three_all_reduces(group); }),
                       doctest::Contains("injected fault disconnect@collective,rank=2,at=1: the rank died at world "
                                         "rank 2's all_reduce #0 on group 'world'"),
                       dist::InjectedFault);

  dist::set_faults(dist::parse_faults("delay@collective,rank=2,at=2,seconds=0.3"));
  std::vector<std::vector<float>> results(3);
  const auto start = std::chrono::steady_clock::now();
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) { results[group->rank()] = three_all_reduces(group); });
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(300));
  for (const auto& result : results) CHECK(result == std::vector<float>(4, 6.0f * 3.0f * 3.0f));
}
