// Peers of a JobSupervisor for its tests (tests/dist/test_lifeline.cpp,
// test_lifeline_strangers.cpp): ranks and strangers that speak the lifeline
// protocol by hand over real TCP on this machine, and polls that wait until
// what is expected happened, bounded generously so a busy machine does not
// fail them.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dist/launch/job_supervisor.h"
#include "dist/launch/lifeline.h"

namespace tessera::test {

using dist::Clock;
using namespace std::chrono_literals;

inline const std::string kTestJobSecret = "lifeline-test-secret-0123456789";

inline dist::JobSupervisorOptions supervisor_options(std::chrono::milliseconds heartbeat_timeout,
                                                     std::chrono::milliseconds hello_timeout = 10s) {
  return {.address = "127.0.0.1",
          .port = 0,
          .job_secret = kTestJobSecret,
          .heartbeat_timeout = heartbeat_timeout,
          .hello_timeout = hello_timeout};
}

inline bool any_contains(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& line) { return line.find(text) != std::string::npos; });
}

inline int count_containing(const std::vector<std::string>& lines, const std::string& text) {
  return static_cast<int>(std::count_if(lines.begin(), lines.end(),
                                        [&](const std::string& line) { return line.find(text) != std::string::npos; }));
}

// Polls until `done` holds or 20 s pass; returns every event seen.
inline std::vector<std::string> poll_until(dist::JobSupervisor& supervisor, const std::function<bool()>& done) {
  std::vector<std::string> events;
  const Clock::time_point limit = Clock::now() + 20s;
  while (!done() && Clock::now() < limit) {
    for (std::string& event : supervisor.poll(20ms)) events.push_back(std::move(event));
  }
  REQUIRE_MESSAGE(done(), "the supervisor did not get there within 20 s");
  return events;
}

// Polls until an event contains every one of `texts` or 20 s pass; returns every event seen.
inline std::vector<std::string> poll_for_events(dist::JobSupervisor& supervisor,
                                                const std::vector<std::string>& texts) {
  std::vector<std::string> events;
  const auto all_seen = [&] {
    return std::all_of(texts.begin(), texts.end(), [&](const std::string& text) { return any_contains(events, text); });
  };
  const Clock::time_point limit = Clock::now() + 20s;
  while (!all_seen() && Clock::now() < limit) {
    for (std::string& event : supervisor.poll(20ms)) events.push_back(std::move(event));
  }
  REQUIRE_MESSAGE(all_seen(), "the supervisor did not report them within 20 s");
  return events;
}

inline const dist::RankRecord* record_of(const dist::JobSupervisor& supervisor, int rank) {
  for (const dist::RankRecord& record : supervisor.ranks()) {
    if (record.rank == rank) return &record;
  }
  return nullptr;
}

inline std::function<bool()> state_is(const dist::JobSupervisor& supervisor, int rank, dist::RankState state) {
  return [&supervisor, rank, state] {
    const dist::RankRecord* record = record_of(supervisor, rank);
    return record != nullptr && record->state == state;
  };
}

inline std::string endpoint_of(const dist::JobSupervisor& supervisor) {
  return fmt::format("127.0.0.1:{}", supervisor.port());
}

inline dist::Lifeline lifeline_to(const dist::JobSupervisor& supervisor, int rank, int world_size,
                                  const std::string& host, const std::string& secret = kTestJobSecret) {
  return dist::Lifeline(endpoint_of(supervisor), secret,
                        {.rank = rank, .world_size = world_size, .pid = 1000 + rank, .host = host}, 50ms, 10s);
}

inline void send_text(const dist::Socket& socket, const std::string& text) {
  dist::send_all(socket, std::as_bytes(std::span(text)), Clock::now() + 10s, "lifeline test");
}

// A connection that has said nothing yet.
inline dist::Socket raw_connection(const dist::JobSupervisor& supervisor) {
  return dist::connect_tcp("127.0.0.1", supervisor.port(), Clock::now() + 10s);
}

// A connection that has sent `text` and waits.
inline dist::Socket peer_sending(const dist::JobSupervisor& supervisor, const std::string& text) {
  dist::Socket socket = raw_connection(supervisor);
  send_text(socket, text);
  return socket;
}

// A rank as the kernel leaves it when the process dies: hello (with the job
// secret), then the connection closes with nothing more; or, left open, a
// rank gone quiet.
inline dist::Socket raw_rank(const dist::JobSupervisor& supervisor, int rank, int world_size,
                             const std::string& host) {
  return peer_sending(supervisor,
                      fmt::format("hello {} {} {} {} {}\n", kTestJobSecret, rank, world_size, 1000 + rank, host));
}

// Whether the other end closed `socket`, without waiting (what it is sent
// is read and dropped: the supervisor sends nothing).
inline bool is_closed(const dist::Socket& socket) {
  pollfd entry{.fd = socket.fd(), .events = POLLIN, .revents = 0};
  if (::poll(&entry, 1, 0) <= 0) return false;
  char byte;
  const ssize_t got = ::recv(socket.fd(), &byte, 1, MSG_DONTWAIT);
  return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// Polls until the supervisor has closed `socket` or 20 s pass; returns every event seen.
inline std::vector<std::string> poll_until_closed(dist::JobSupervisor& supervisor, const dist::Socket& socket) {
  return poll_until(supervisor, [&] { return is_closed(socket); });
}

}  // namespace tessera::test
