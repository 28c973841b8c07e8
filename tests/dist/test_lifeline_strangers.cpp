// What a process that reaches the launcher's port can and cannot do to the
// JobSupervisor (dist/launch/job_supervisor.h): without the job secret
// nothing it says counts; with it, only a hello that fits the job; and no
// peer makes the supervisor hold more than its bounds, spin, or log without
// end. Spinning is judged by how many polls of 100 ms fit in a stretch of
// time (a spinning supervisor returns from each at once), which a busy
// machine can only make fewer.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dist/launch/job_supervisor.h"
#include "dist/launch/lifeline.h"
#include "tests/dist/lifeline_peers.h"

using namespace tessera;
using namespace tessera::dist;
using namespace tessera::test;
using namespace std::chrono_literals;

namespace {

constexpr const char* kStrangerClosed = "did not present the job secret: closed, nothing taken from it";

// This thread's CPU time so far.
std::chrono::duration<double> thread_cpu_time() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  const auto seconds = [](const timeval& time) { return time.tv_sec + time.tv_usec / 1e6; };
  return std::chrono::duration<double>(seconds(usage.ru_utime) + seconds(usage.ru_stime));
}

// What polling with 100 ms waits for a stretch of time cost: the polls
// made, the events and this thread's CPU time.
struct PollingCost {
  int polls = 0;
  std::vector<std::string> events;
  std::chrono::duration<double> cpu{0};
  int most_connections = 0;
};

PollingCost poll_for(JobSupervisor& supervisor, std::chrono::milliseconds stretch) {
  PollingCost cost;
  const auto cpu_before = thread_cpu_time();
  const Clock::time_point until = Clock::now() + stretch;
  while (Clock::now() < until) {
    for (std::string& event : supervisor.poll(100ms)) cost.events.push_back(std::move(event));
    ++cost.polls;
    cost.most_connections = std::max(cost.most_connections, supervisor.connections());
  }
  cost.cpu = thread_cpu_time() - cpu_before;
  return cost;
}

// A poll of 100 ms returns early only when something arrives (a few
// hundred connections here); a supervisor that spins returns from tens of
// thousands.
constexpr int kPollsThatAreNoSpin = 1000;

// Lowers this process's descriptor limit to the lowest free descriptor, so
// that the next accept fails with EMFILE; restores it when it goes.
class NoDescriptorLeft {
 public:
  NoDescriptorLeft() {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    const int lowest_free = ::dup(0);  // a new descriptor is always the lowest free one
    REQUIRE(lowest_free >= 0);
    ::close(lowest_free);
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(lowest_free);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  }
  ~NoDescriptorLeft() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  NoDescriptorLeft(const NoDescriptorLeft&) = delete;
  NoDescriptorLeft& operator=(const NoDescriptorLeft&) = delete;

 private:
  rlimit saved_{};
};

}  // namespace

TEST_SUITE("dist lifeline strangers") {

TEST_CASE("a stranger who knows the port but not the secret cannot change the job's outcome") {
  JobSupervisor supervisor(supervisor_options(10s));
  // First, before any rank: a stranger's hello must not fix the world size.
  Socket early = peer_sending(supervisor, "hello 5 8 4242 x\nfailed the job is over\n");
  std::vector<std::string> events = poll_until_closed(supervisor, early);
  CHECK(supervisor.world_size() == 0);

  Lifeline rank0 = lifeline_to(supervisor, 0, 2, "host-a");
  Lifeline rank1 = lifeline_to(supervisor, 1, 2, "host-b");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 2; });
  // The line; another job's secret; this job's secret but one
  // character short; no hello at all; a line of nothing.
  const std::string short_secret = kTestJobSecret.substr(0, kTestJobSecret.size() - 1);
  const std::vector<std::string> attempts = {"hello 5 8 4242 x\nfailed ...\n",
                                             "hello another-jobs-secret-0000 1 2 4242 host-b\nfailed x\n",
                                             fmt::format("hello {} 1 2 4242 host-b\nfailed x\n", short_secret),
                                             "failed rank 0 is dead\n", "\n"};
  for (const std::string& attempt : attempts) {
    CAPTURE(attempt);
    Socket stranger = peer_sending(supervisor, attempt);
    for (std::string& event : poll_until_closed(supervisor, stranger)) events.push_back(std::move(event));
  }
  // A lifeline of another job: its hello is sent, and nothing comes of it.
  {
    Lifeline foreign = lifeline_to(supervisor, 1, 2, "host-c", "another-jobs-secret-0000");
    foreign.report_failure("a failure from another job");
    for (std::string& event : poll_until(supervisor, [&] {
           return any_contains(supervisor.summary(), "connections closed without the job secret: 7");
         })) {
      events.push_back(std::move(event));
    }
  }
  CHECK(supervisor.world_size() == 2);
  CHECK(supervisor.ranks().size() == 2);
  CHECK_FALSE(supervisor.job_failed());
  CHECK(supervisor.root_cause().empty());
  // One line for them all, naming where the first came from.
  CHECK(count_containing(events, "job secret") == 1);
  CHECK(any_contains(events, "a connection from 127.0.0.1:"));
  CHECK_FALSE(any_contains(events, "failed"));
  CHECK_FALSE(any_contains(events, "lost"));

  rank0.report_done();
  rank1.report_done();
  poll_until(supervisor, [&] { return supervisor.open_lifelines() == 0; });
  CHECK_FALSE(supervisor.job_failed());
  CHECK(supervisor.summary() == std::vector<std::string>{"host-a: rank 0 done", "host-b: rank 1 done",
                                                         "connections closed without the job secret: 7"});
}

TEST_CASE("a hello with an absurd world size is refused, and the summary never grows with a number a peer sent") {
  JobSupervisor supervisor(supervisor_options(10s));
  Socket absurd = raw_rank(supervisor, 5, 2147483647, "h");
  std::vector<std::string> events = poll_until_closed(supervisor, absurd);
  CHECK(any_contains(events, "rank 5 on h (pid 1005) says the world has 2147483647 ranks; a job has 1 to 65536"));
  Socket overflowing = peer_sending(supervisor, fmt::format("hello {} 5 99999999999999999999 1 h\n", kTestJobSecret));
  events = poll_until_closed(supervisor, overflowing);
  CHECK(any_contains(events, "refused: not 'hello <secret> <rank> <world size> <pid> <host>'"));
  CHECK(supervisor.world_size() == 0);
  CHECK(supervisor.ranks().empty());

  // The largest world there may be, one rank heard: a few of the others are
  // named and the rest counted.
  Socket one_of_many = raw_rank(supervisor, 7, JobSupervisor::kMaxWorldSize, "host-a");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 1; });
  const Clock::time_point start = Clock::now();
  const std::vector<std::string> summary = supervisor.summary();
  CHECK(Clock::now() - start < 1s);
  CHECK(summary == std::vector<std::string>{
                       "host-a: rank 7 running",
                       "never heard from: ranks 0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 65519 more "
                       "(not started, or ended before dist::init)",
                       "hellos refused: 2"});
}

TEST_CASE("a hello that does not fit the job is refused and closed: a rank twice, outside the world, another world") {
  JobSupervisor supervisor(supervisor_options(10s));
  Socket rank0 = raw_rank(supervisor, 0, 2, "host-a");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 1; });
  const auto refused = [&](const std::function<Socket()>& connect, const std::string& why) {
    CAPTURE(why);
    Socket socket = connect();
    const std::vector<std::string> events = poll_until_closed(supervisor, socket);
    CHECK(any_contains(events, why));
  };
  refused([&] { return raw_rank(supervisor, 0, 2, "host-b"); },
          "refused: rank 0 said hello twice: from host-a (pid 1000), now from host-b (pid 1000)");
  refused([&] { return raw_rank(supervisor, 2, 2, "host-b"); },
          "refused: rank 2 on host-b (pid 1002) is outside a world of 2");
  refused([&] { return raw_rank(supervisor, -1, 2, "host-b"); },
          "refused: rank -1 on host-b (pid 999) is outside a world of 2");
  refused([&] { return raw_rank(supervisor, 1, 3, "host-b"); },
          "refused: rank 1 on host-b (pid 1001) says the world has 3 ranks; the job's first hello said 2");
  refused([&] { return peer_sending(supervisor, fmt::format("hello {} 1 2 0 host-b\n", kTestJobSecret)); },
          "refused: pid 0 or a host name of 6 bytes is not a process's");
  refused([&] { return peer_sending(supervisor, fmt::format("hello {} 1 2 77 host b\n", kTestJobSecret)); },
          "refused: not 'hello <secret> <rank> <world size> <pid> <host>'");
  CHECK(supervisor.ranks().size() == 1);
  CHECK(supervisor.world_size() == 2);
  CHECK_FALSE(supervisor.job_failed());
  // Rank 1, refused with a hello that did not fit, is welcome with one that does.
  Socket rank1 = raw_rank(supervisor, 1, 2, "host-b");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 2; });
  CHECK(any_contains(supervisor.summary(), "hellos refused: 6"));
}

TEST_CASE("lines are bounded: a stranger's before its hello, a rank's after it") {
  JobSupervisor supervisor(supervisor_options(10s));
  Socket stranger = peer_sending(supervisor, std::string(2 * JobSupervisor::kMaxHelloBytes, 'x'));
  std::vector<std::string> events = poll_until_closed(supervisor, stranger);
  CHECK(any_contains(events, "sent over 1024 bytes without a hello: closed, nothing taken from it"));
  CHECK(supervisor.ranks().empty());

  Socket rank0 = raw_rank(supervisor, 0, 1, "host-a");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 1; });
  // Sent from a thread: the socket buffers may not hold it all before the
  // supervisor reads, and the send fails once the supervisor has closed.
  std::thread sender([&] {
    try {
      send_text(rank0, std::string(JobSupervisor::kMaxLineBytes + 8192, 'y'));
    } catch (const Error&) {
    }
  });
  events = poll_until_closed(supervisor, rank0);
  sender.join();
  CHECK(any_contains(events, "rank 0 on host-a (pid 1000) sent a line over 64 KiB: not a lifeline's"));
  CHECK(state_is(supervisor, 0, RankState::lost)());
}

TEST_CASE("a connection that says nothing is closed after the hello timeout, without effect") {
  JobSupervisor supervisor(supervisor_options(10s, 300ms));
  Socket quiet = raw_connection(supervisor);
  const std::vector<std::string> events = poll_until_closed(supervisor, quiet);
  CHECK(any_contains(events, "said no hello within 0.3 s: closed"));
  CHECK(supervisor.ranks().empty());
  CHECK(supervisor.connections() == 0);
}

TEST_CASE("a flood of idle connections is held within the bound and closed in time, without a spin or a log flood") {
  JobSupervisor supervisor(supervisor_options(60s, 1s));  // rank 0 never beats: it must not turn silent
  Socket rank0 = raw_rank(supervisor, 0, 1, "host-a");
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 1; });
  // 300 connections that never say a word, opened while the supervisor polls.
  constexpr int kFlood = 300;
  std::vector<Socket> flood;
  std::atomic<bool> flooded{false};
  std::thread flooder([&] {
    for (int i = 0; i < kFlood; ++i) flood.push_back(raw_connection(supervisor));
    flooded = true;
  });
  PollingCost cost = poll_for(supervisor, 3s);
  flooder.join();
  REQUIRE(flooded);
  CHECK(cost.most_connections <= JobSupervisor::kMaxPendingConnections + 1);
  CHECK(cost.polls < kPollsThatAreNoSpin);
  CHECK(cost.cpu < 500ms);
  // Each batch of the bound is closed a hello timeout after it came in, and the next let in.
  const std::string all_closed = fmt::format("connections closed without the job secret: {}", kFlood);
  for (std::string& event : poll_until(supervisor, [&] { return any_contains(supervisor.summary(), all_closed); })) {
    cost.events.push_back(std::move(event));
  }
  CHECK(supervisor.connections() == 1);
  MESSAGE(fmt::format("{} idle connections: {} polls of 100 ms in 3 s, {:.3f} s of CPU, {} events, at most {} held",
                      kFlood, cost.polls, cost.cpu.count(), cost.events.size(), cost.most_connections));
  // One line, and a count at most every 10 s after it.
  CHECK(count_containing(cost.events, "said no hello within 1.0 s: closed") >= 1);
  CHECK(cost.events.size() <= 4);
  CHECK(state_is(supervisor, 0, RankState::running)());
  CHECK_FALSE(supervisor.job_failed());
}

TEST_CASE("an accept that fails for want of descriptors pauses accepting: one log line, no spin, and it recovers") {
  JobSupervisor supervisor(supervisor_options(10s));
  // Three ranks whose connections and hellos wait in the kernel's backlog.
  std::vector<Socket> ranks;
  for (int rank = 0; rank < 3; ++rank) ranks.push_back(raw_rank(supervisor, rank, 3, "host-a"));
  PollingCost cost;
  {
    NoDescriptorLeft no_descriptor_left;
    cost = poll_for(supervisor, 2500ms);
  }
  MESSAGE(fmt::format("with no descriptor left: {} polls of 100 ms in 2.5 s, {:.3f} s of CPU, {} events", cost.polls,
                      cost.cpu.count(), cost.events.size()));
  CHECK(supervisor.ranks().empty());
  REQUIRE(cost.events.size() == 1);
  CHECK(cost.events[0].starts_with("cannot accept a lifeline: Too many open files (holding 0 connections); not "
                                   "accepting for 1 s"));
  CHECK(cost.polls < kPollsThatAreNoSpin);
  CHECK(cost.cpu < 500ms);
  // With descriptors again, the ranks waiting in the backlog come in.
  poll_until(supervisor, [&] { return supervisor.ranks().size() == 3; });
  CHECK(any_contains(supervisor.summary(), "accepts that failed: "));
}

}  // TEST_SUITE
