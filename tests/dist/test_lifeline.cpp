// Lifelines and the JobSupervisor that reads them (dist/launch/lifeline.h,
// dist/launch/job_supervisor.h), over real TCP on this machine. A killed rank is a
// raw connection that said hello and closed; a stopped one, a connection
// that stops beating (tests/dist/lifeline_peers.h). What strangers and bad
// hellos can do is tests/dist/test_lifeline_strangers.cpp's.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dist/launch/fault_injection.h"
#include "dist/launch/job_supervisor.h"
#include "dist/launch/lifeline.h"
#include "tests/dist/error_message.h"
#include "tests/dist/lifeline_peers.h"

using namespace tessera;
using namespace tessera::dist;
using namespace tessera::test;
using namespace std::chrono_literals;

TEST_SUITE("dist lifeline") {

TEST_CASE("a launcher's endpoint is host:port, an IPv6 address in brackets") {
  CHECK(parse_endpoint("10.0.0.1:29400", "V") == std::pair<std::string, int>{"10.0.0.1", 29400});
  CHECK(parse_endpoint("node-7:1", "V") == std::pair<std::string, int>{"node-7", 1});
  CHECK(parse_endpoint("[fe80::1]:65535", "V") == std::pair<std::string, int>{"fe80::1", 65535});
  for (const char* bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:8x", "fe80::1:80", "[]:80",
                          "[::1:80"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_endpoint(bad, "TESSERA_LAUNCHER"),
                         doctest::Contains(fmt::format("TESSERA_LAUNCHER='{}' is not host:port", bad).c_str()), Error);
  }
}

TEST_CASE("ranks that end cleanly: each host and rank named, no failure") {
  JobSupervisor supervisor(supervisor_options(10s));
  {
    Lifeline rank0 = lifeline_to(supervisor, 0, 2, "host-a");
    Lifeline rank1 = lifeline_to(supervisor, 1, 2, "host-b");
    poll_until(supervisor, [&] { return supervisor.ranks().size() == 2; });
    CHECK(supervisor.world_size() == 2);
    CHECK(supervisor.open_lifelines() == 2);
    rank0.report_done();
    rank1.report_done();
    poll_until(supervisor, [&] { return supervisor.open_lifelines() == 0; });
  }
  CHECK_FALSE(supervisor.job_failed());
  CHECK(supervisor.root_cause().empty());
  CHECK(supervisor.summary() == std::vector<std::string>{"host-a: rank 0 done", "host-b: rank 1 done"});
  CHECK(record_of(supervisor, 1)->pid == 1001);
}

TEST_CASE("ranks that stop on request and end cleanly stopped; one killed while stopping was lost") {
  JobSupervisor supervisor(supervisor_options(10s));
  {
    Lifeline rank0 = lifeline_to(supervisor, 0, 2, "host-a");
    Lifeline rank1 = lifeline_to(supervisor, 1, 2, "host-a");
    poll_until(supervisor, [&] { return supervisor.ranks().size() == 2; });
    rank0.report_stopping();
    rank1.report_stopping();
    rank1.report_stopping();  // sent once
    const std::vector<std::string> events = poll_until(
        supervisor, [&] { return record_of(supervisor, 0)->stopping && record_of(supervisor, 1)->stopping; });
    CHECK(any_contains(events, "stopping on request"));
    CHECK(std::count_if(events.begin(), events.end(), [](const std::string& event) {
            return event.find("stopping") != std::string::npos;
          }) == 1);  // one line for the job
    CHECK_FALSE(supervisor.every_rank_ended());
    rank0.report_done();
    rank1.report_done();
    poll_until(supervisor, [&] { return supervisor.every_rank_ended(); });
  }
  CHECK(supervisor.job_stopped());
  CHECK_FALSE(supervisor.job_failed());
  CHECK(supervisor.root_cause().empty());
  CHECK(supervisor.summary() == std::vector<std::string>{"host-a: rank 0 stopped, rank 1 stopped"});

  JobSupervisor killed_while_stopping(supervisor_options(10s));
  Lifeline survivor = lifeline_to(killed_while_stopping, 0, 2, "host-a");
  {
    Socket killed = raw_rank(killed_while_stopping, 1, 2, "host-a");
    send_text(killed, "stopping\n");
    poll_until(killed_while_stopping, [&] {
      const RankRecord* record = record_of(killed_while_stopping, 1);
      return record != nullptr && record->stopping;
    });
  }  // killed during its save
  poll_until(killed_while_stopping, state_is(killed_while_stopping, 1, RankState::lost));
  survivor.report_stopping();
  survivor.report_done();
  poll_until(killed_while_stopping, [&] { return killed_while_stopping.every_rank_ended(); });
  CHECK(killed_while_stopping.job_failed());
  CHECK_FALSE(killed_while_stopping.job_stopped());
  CHECK(killed_while_stopping.summary() ==
        std::vector<std::string>{"host-a: rank 0 stopped, rank 1 lost (while stopping)"});
}

TEST_CASE("a rank whose line closes with no result was lost: the launcher names it, its host and pid") {
  JobSupervisor supervisor(supervisor_options(10s));
  Lifeline survivor = lifeline_to(supervisor, 0, 2, "host-a");
  {
    Socket killed = raw_rank(supervisor, 1, 2, "host-b");
    poll_until(supervisor, [&] { return supervisor.ranks().size() == 2; });
  }  // closed: as the kernel closes a killed process's sockets
  const std::vector<std::string> events = poll_until(supervisor, state_is(supervisor, 1, RankState::lost));
  CHECK(any_contains(events, "rank 1 on host-b (pid 1001) lost"));
  CHECK(any_contains(events, "its lifeline closed with no result"));
  CHECK(supervisor.job_failed());
  CHECK(supervisor.root_cause().starts_with("rank 1 on host-b (pid 1001) was lost"));
  CHECK(state_is(supervisor, 0, RankState::running)());
  CHECK_FALSE(any_contains(events, "host host-b lost"));  // one rank of a host is not the host
}

TEST_CASE("a rank's failure is reported with its message, on one line; the first failure is the root cause") {
  JobSupervisor supervisor(supervisor_options(10s));
  Lifeline first = lifeline_to(supervisor, 0, 3, "host-a");
  Lifeline second = lifeline_to(supervisor, 1, 3, "host-a");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 2; });
  first.report_failure("tessera mpi watchdog: #7 all_gather on group 'world' timed out\nAborting the job\n");
  const std::vector<std::string> events = poll_until(supervisor, state_is(supervisor, 0, RankState::failed));
  CHECK(any_contains(events, "rank 0 on host-a (pid 1000) failed"));
  CHECK(any_contains(events, "#7 all_gather on group 'world' timed out | Aborting the job"));
  first.report_failure("a second report is dropped");
  second.report_failure("a consequence of rank 0's");
  poll_until(supervisor, state_is(supervisor, 1, RankState::failed));
  CHECK(supervisor.root_cause().find("rank 0 on host-a") != std::string::npos);
  CHECK(record_of(supervisor, 0)->failure.find("second report") == std::string::npos);
  // Rank 2 never connected: the summary says so.
  CHECK(any_contains(supervisor.summary(), "never heard from: rank 2"));
}

TEST_CASE("a rank that stops beating turns silent, and answers again when it beats") {
  JobSupervisor supervisor(supervisor_options(300ms));
  Socket quiet = raw_rank(supervisor, 0, 1, "host-a");
  std::vector<std::string> events = poll_until(supervisor, state_is(supervisor, 0, RankState::silent));
  CHECK(any_contains(events, "rank 0 on host-a (pid 1000) silent: no heartbeat for"));
  CHECK_FALSE(supervisor.job_failed());  // silence alone never ends a job
  CHECK(supervisor.root_cause().find("went silent") != std::string::npos);
  send_text(quiet, "beat\n");
  events = poll_until(supervisor, state_is(supervisor, 0, RankState::running));
  CHECK(any_contains(events, "rank 0 on host-a (pid 1000) answers again"));
}

TEST_CASE("the first failure: a silence that lasted up to a rank's failure, not one that ended before") {
  JobSupervisor supervisor(supervisor_options(300ms));
  Socket blip = raw_rank(supervisor, 0, 3, "host-a");     // silent, then heard again before any failure
  Socket stopped = raw_rank(supervisor, 1, 3, "host-b");  // silent until after it (woken to be killed)
  Lifeline failing = lifeline_to(supervisor, 2, 3, "host-a");
  poll_until(supervisor, [&] {
    return state_is(supervisor, 0, RankState::silent)() && state_is(supervisor, 1, RankState::silent)();
  });
  send_text(blip, "beat\n");
  poll_until(supervisor, state_is(supervisor, 0, RankState::running));
  failing.report_failure("tessera mpi watchdog: rank 1 never answered the roll call");
  poll_until(supervisor, state_is(supervisor, 2, RankState::failed));
  send_text(stopped, "beat\n");
  poll_until(supervisor, state_is(supervisor, 1, RankState::running));
  CHECK(supervisor.root_cause().starts_with("rank 1 on host-b (pid 1001) went silent"));
  CHECK(any_contains(supervisor.summary(), "host-b: rank 1 running (silent from"));
}

TEST_CASE("a host whose every rank is lost or silent is named as lost") {
  JobSupervisor supervisor(supervisor_options(10s));
  Lifeline on_a = lifeline_to(supervisor, 0, 3, "host-a");
  Socket stopped = raw_rank(supervisor, 2, 3, "host-b");
  std::vector<std::string> events;
  {
    Socket killed = raw_rank(supervisor, 1, 3, "host-b");
    poll_until(supervisor, [&] { return supervisor.ranks().size() == 3; });
  }
  events = poll_until(supervisor, state_is(supervisor, 1, RankState::lost));
  CHECK_FALSE(any_contains(events, "host host-b lost"));  // rank 2 is still open and recent
  // The job has ended (say): rank 2 has not been heard for longer than settle's quiet time.
  std::this_thread::sleep_for(600ms);
  const std::vector<std::string> settled = supervisor.settle(400ms);
  CHECK(any_contains(settled, "rank 2 on host-b (pid 1002) silent"));
  CHECK(any_contains(settled, "host host-b lost: none of its ranks (1, 2) can be heard"));
  CHECK(state_is(supervisor, 0, RankState::running)());  // it beats every 50 ms: its process may be alive
  CHECK(supervisor.summary() ==
        std::vector<std::string>{"host-a: rank 0 running", "host-b: rank 1 lost, rank 2 silent"});
}

TEST_CASE("an injected disconnect shuts the process's connections: the launcher hears the rank lost") {
  JobSupervisor supervisor(supervisor_options(10s));
  Lifeline rank0 = lifeline_to(supervisor, 0, 1, "host-a");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 1; });
  // This test process is the rank: its lifeline (and the supervisor's own
  // sockets, which live here too) are shut down.
  dist::carry_out(dist::parse_faults("disconnect@collective,rank=0").front(), "the test", /*rank_is_process=*/true);
  const std::vector<std::string> events = poll_until(supervisor, state_is(supervisor, 0, RankState::lost));
  CHECK(any_contains(events, "rank 0 on host-a (pid 1000) lost"));
}

TEST_CASE("a host whose ranks are lost after the trouble began elsewhere is not named: that is the teardown") {
  JobSupervisor supervisor(supervisor_options(10s));
  std::vector<Socket> host_b;
  {
    Socket first = raw_rank(supervisor, 0, 3, "host-a");
    host_b.push_back(raw_rank(supervisor, 1, 3, "host-b"));
    host_b.push_back(raw_rank(supervisor, 2, 3, "host-b"));
    poll_until(supervisor, [&] { return supervisor.ranks().size() == 3; });
  }
  std::vector<std::string> events = poll_until(supervisor, state_is(supervisor, 0, RankState::lost));
  host_b.clear();  // mpirun kills the survivors
  for (std::string& event : poll_until(supervisor, [&] { return supervisor.open_lifelines() == 0; })) {
    events.push_back(std::move(event));
  }
  CHECK_FALSE(any_contains(events, "host host-b lost"));
  CHECK(supervisor.root_cause().starts_with("rank 0 on host-a (pid 1000) was lost"));
}

TEST_CASE("a lifeline dropped without a result says the process exited on its own") {
  JobSupervisor supervisor(supervisor_options(10s));
  { Lifeline rank0 = lifeline_to(supervisor, 0, 1, "host-a"); }
  const std::vector<std::string> events = poll_until(supervisor, state_is(supervisor, 0, RankState::exited));
  CHECK(any_contains(events, "rank 0 on host-a (pid 1000) exited before its job ended"));
  CHECK_FALSE(supervisor.job_failed());
}

TEST_CASE("a line from a rank that is no lifeline message is reported and ignored") {
  JobSupervisor supervisor(supervisor_options(10s));
  Socket rank0 = raw_rank(supervisor, 0, 2, "host-a");
  send_text(rank0, "nonsense\n");
  poll_for_events(supervisor, {"rank 0 on host-a (pid 1000) sent 'nonsense': not a lifeline message; ignored"});
  CHECK(state_is(supervisor, 0, RankState::running)());
  CHECK(supervisor.open_lifelines() == 1);
}

TEST_CASE("a lifeline to a launcher that is not there fails within its timeout, naming it") {
  int port = 0;
  {
    JobSupervisor gone(supervisor_options(1s));
    port = gone.port();
  }
  const Clock::time_point start = Clock::now();
  const std::string message = message_of([&] {
    Lifeline(fmt::format("127.0.0.1:{}", port), kTestJobSecret, {.rank = 0, .world_size = 1, .pid = 1, .host = "h"},
             50ms, 300ms);
  });
  CHECK(message.find(fmt::format("127.0.0.1:{}", port)) != std::string::npos);
  // A launcher on loopback is one that judged the job to be on its own host.
  CHECK(message.find("for ranks on other hosts give it --address") != std::string::npos);
  CHECK(Clock::now() - start < 20s);
}

TEST_CASE("without TESSERA_LAUNCHER no lifeline is opened, and the reports do nothing") {
  open_process_lifeline(0, 1, [](const std::string&) { return std::nullopt; });
  report_failure_to_launcher("nobody listens");
  report_clean_end_to_launcher();
  const auto launcher_nowhere = [](const std::string& name) -> std::optional<std::string> {
    return name == kLauncherVariable ? "nowhere" : kTestJobSecret;
  };
  CHECK_THROWS_WITH_AS(open_process_lifeline(0, 1, launcher_nowhere),
                       doctest::Contains("TESSERA_LAUNCHER='nowhere' is not host:port"), Error);
}

TEST_CASE("a rank told where the launcher is but not the job secret fails, naming both variables") {
  const auto launcher_only = [](const std::string& name) -> std::optional<std::string> {
    if (name == kLauncherVariable) return "127.0.0.1:1";
    return std::nullopt;
  };
  CHECK(message_of([&] { open_process_lifeline(0, 2, launcher_only); }) ==
        "TESSERA_LAUNCHER is set but TESSERA_JOB_SECRET is not: the launcher sets both (and forwards both with "
        "mpirun's -x); a rank without the secret cannot join its lifelines");
}

}  // TEST_SUITE
