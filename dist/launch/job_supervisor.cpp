// JobSupervisor (contract in job_supervisor.h): one poll() over the
// listening socket and every lifeline, each read into a line buffer.
#include "dist/launch/job_supervisor.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tessera::dist {

struct JobSupervisor::Connection {
  Socket socket;
  std::string input;
  int rank = -1;  // -1 until its hello
  bool result = false;
};

namespace {

// A line longer than this is not a lifeline's: the connection is dropped.
constexpr size_t kMaxLineBytes = 64 * 1024;

bool parse_int(std::string_view text, int& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

bool is_lost_or_silent(RankState state) { return state == RankState::lost || state == RankState::silent; }

}  // namespace

std::string_view rank_state_name(RankState state) {
  switch (state) {
    case RankState::running: return "running";
    case RankState::silent: return "silent";
    case RankState::done: return "done";
    case RankState::stopped: return "stopped";
    case RankState::exited: return "exited";
    case RankState::failed: return "failed";
    case RankState::lost: return "lost";
  }
  return "unknown";
}

JobSupervisor::JobSupervisor(int port, std::chrono::milliseconds heartbeat_timeout)
    : listener_(listen_tcp(kEveryInterface, port)), heartbeat_timeout_(heartbeat_timeout), start_(Clock::now()) {
  TESSERA_CHECK(heartbeat_timeout.count() > 0, "JobSupervisor: the heartbeat timeout must be positive, got {} ms",
                heartbeat_timeout.count());
  port_ = bound_port(listener_);
}

JobSupervisor::~JobSupervisor() = default;

int JobSupervisor::open_lifelines() const {
  return static_cast<int>(std::count_if(connections_.begin(), connections_.end(),
                                        [](const Connection& connection) { return !connection.result; }));
}

bool JobSupervisor::job_failed() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankRecord& record) {
    return record.state == RankState::failed || record.state == RankState::lost;
  });
}

bool JobSupervisor::every_rank_ended() const {
  if (world_size_ == 0 || ranks_.size() != static_cast<size_t>(world_size_)) return false;
  return std::none_of(ranks_.begin(), ranks_.end(), [](const RankRecord& record) {
    return record.state == RankState::running || record.state == RankState::silent;
  });
}

bool JobSupervisor::job_stopped() const {
  return every_rank_ended() && std::all_of(ranks_.begin(), ranks_.end(), [](const RankRecord& record) {
           return record.state == RankState::stopped;
         });
}

double JobSupervisor::seconds_since_start(Clock::time_point when) const {
  return std::chrono::duration<double>(when - start_).count();
}

std::string JobSupervisor::describe(const RankRecord& record) const {
  return fmt::format("rank {} on {} (pid {})", record.rank, record.host, record.pid);
}

RankRecord* JobSupervisor::record_of(int rank) {
  for (RankRecord& record : ranks_) {
    if (record.rank == rank) return &record;
  }
  return nullptr;
}

std::vector<std::string> JobSupervisor::poll(std::chrono::milliseconds wait) {
  std::vector<std::string> events;
  std::vector<pollfd> entries;
  entries.push_back({.fd = listener_.fd(), .events = POLLIN, .revents = 0});
  for (const Connection& connection : connections_) {
    entries.push_back({.fd = connection.socket.fd(), .events = POLLIN, .revents = 0});
  }
  const int ready = ::poll(entries.data(), entries.size(), static_cast<int>(wait.count()));
  if (ready < 0 && errno != EINTR) fail("JobSupervisor: poll failed: {}", std::strerror(errno));
  if (ready > 0) {
    // Connections first (their indices are those of `entries`), then new ones.
    std::vector<size_t> closed;
    for (size_t i = 0; i < connections_.size(); ++i) {
      if (entries[i + 1].revents != 0 && !read_from(connections_[i], events)) closed.push_back(i);
    }
    for (auto it = closed.rbegin(); it != closed.rend(); ++it) {
      end_connection(connections_[*it], events);
      connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
    if (entries[0].revents & POLLIN) accept_waiting(events);
  }
  check_silence(heartbeat_timeout_, events);
  check_hosts(events);
  return events;
}

std::vector<std::string> JobSupervisor::settle(std::chrono::milliseconds quiet) {
  std::vector<std::string> events = poll(std::chrono::milliseconds(0));
  check_silence(quiet, events);
  check_hosts(events);
  return events;
}

void JobSupervisor::accept_waiting(std::vector<std::string>& events) {
  for (;;) {
    const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        events.push_back(fmt::format("accepting a lifeline failed: {}", std::strerror(errno)));
      }
      return;
    }
    Connection connection;
    connection.socket = Socket(fd);
    connections_.push_back(std::move(connection));
  }
}

bool JobSupervisor::read_from(Connection& connection, std::vector<std::string>& events) {
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::recv(connection.socket.fd(), buffer, sizeof buffer, 0);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;  // ECONNRESET and the like: closed
    }
    connection.input.append(buffer, static_cast<size_t>(got));
    size_t newline;
    while ((newline = connection.input.find('\n')) != std::string::npos) {
      const std::string line = connection.input.substr(0, newline);
      connection.input.erase(0, newline + 1);
      handle_line(connection, line, events);
    }
    if (connection.input.size() > kMaxLineBytes) {
      events.push_back("a lifeline sent a line over 64 KiB: not a tessera rank; dropped");
      return false;
    }
  }
}

void JobSupervisor::handle_line(Connection& connection, const std::string& line, std::vector<std::string>& events) {
  const Clock::time_point now = Clock::now();
  if (connection.rank < 0 && connection.result) return;  // refused at its first line: nothing more is read into it
  if (connection.rank < 0) {
    // hello <rank> <world size> <pid> <host>
    std::istringstream words(line);
    std::string word, rank_text, size_text, pid_text, host;
    int rank = 0, size = 0, pid = 0;
    if (!(words >> word >> rank_text >> size_text >> pid_text >> host) || word != "hello" ||
        !parse_int(rank_text, rank) || !parse_int(size_text, size) || !parse_int(pid_text, pid) || rank < 0 ||
        size < 1 || rank >= size) {
      events.push_back(fmt::format("a lifeline began with '{}', not a hello: ignored", line.substr(0, 200)));
      connection.result = true;  // nothing to wait for from it
      return;
    }
    if (world_size_ == 0) world_size_ = size;
    if (size != world_size_) {
      events.push_back(fmt::format("rank {} on {} says the world has {} ranks; earlier ranks said {}", rank, host,
                                   size, world_size_));
    }
    if (RankRecord* earlier = record_of(rank)) {
      events.push_back(fmt::format("rank {} said hello twice: from {} (pid {}), now from {} (pid {})", rank,
                                   earlier->host, earlier->pid, host, pid));
      connection.result = true;
      return;
    }
    connection.rank = rank;
    RankRecord record;
    record.rank = rank;
    record.pid = pid;
    record.host = host;
    record.last_heard = now;
    ranks_.push_back(std::move(record));
    return;
  }
  RankRecord& record = *record_of(connection.rank);
  record.last_heard = now;
  if (record.state == RankState::silent) {
    record.state = RankState::running;
    if (!record.silent_until) record.silent_until = now;
    events.push_back(fmt::format("{} answers again", describe(record)));
  }
  if (line == "beat") return;
  if (connection.result) return;  // a rank's first result stands
  if (line == "stopping") {
    // One line for the job: every rank says it within a step of the first.
    const bool first =
        std::none_of(ranks_.begin(), ranks_.end(), [](const RankRecord& other) { return other.stopping; });
    if (first) {
      events.push_back(fmt::format("{} stopping on request {:.1f} s in: the ranks save their last finished step, "
                                   "then end",
                                   describe(record), seconds_since_start(now)));
    }
    record.stopping = true;
    return;
  }
  if (line == "done" || line == "exited") {
    record.state = line == "exited" ? RankState::exited : record.stopping ? RankState::stopped : RankState::done;
    if (record.state == RankState::exited) {
      events.push_back(fmt::format("{} exited before its job ended (std::exit in a rank?)", describe(record)));
    }
  } else if (line.starts_with("failed ")) {
    record.state = RankState::failed;
    record.failure = line.substr(7);
    events.push_back(fmt::format("{} failed {:.1f} s in: {}", describe(record), seconds_since_start(now),
                                 record.failure));
  } else {
    events.push_back(fmt::format("{} sent '{}': not a lifeline message; ignored", describe(record),
                                 line.substr(0, 200)));
    return;
  }
  connection.result = true;
  record.ended = now;
}

void JobSupervisor::end_connection(Connection& connection, std::vector<std::string>& events) {
  if (connection.rank < 0 || connection.result) return;
  RankRecord& record = *record_of(connection.rank);
  record.state = RankState::lost;
  record.ended = Clock::now();
  connection.result = true;
  events.push_back(fmt::format("{} lost {:.1f} s in: its lifeline closed with no result (the process was killed, "
                               "or its host went down)",
                               describe(record), seconds_since_start(record.ended)));
}

void JobSupervisor::check_silence(std::chrono::milliseconds limit, std::vector<std::string>& events) {
  const Clock::time_point now = Clock::now();
  for (const Connection& connection : connections_) {
    if (connection.rank < 0 || connection.result) continue;
    RankRecord& record = *record_of(connection.rank);
    if (record.state != RankState::running || now - record.last_heard <= limit) continue;
    record.state = RankState::silent;
    if (!record.silent_from) record.silent_from = record.last_heard;
    events.push_back(fmt::format("{} silent: no heartbeat for {:.1f} s (stopped, or its host or link is down)",
                                 describe(record), std::chrono::duration<double>(now - record.last_heard).count()));
  }
}

void JobSupervisor::check_hosts(std::vector<std::string>& events) {
  std::map<std::string, std::vector<const RankRecord*>> by_host;
  for (const RankRecord& record : ranks_) by_host[record.host].push_back(&record);
  for (const auto& [host, records] : by_host) {
    const bool all_gone = std::all_of(records.begin(), records.end(),
                                      [](const RankRecord* record) { return is_lost_or_silent(record->state); });
    const bool named = std::find(hosts_named_lost_.begin(), hosts_named_lost_.end(), host) != hosts_named_lost_.end();
    if (!all_gone || named) continue;
    // Only the host where the trouble began: the job's teardown (mpirun
    // killing the survivors) would otherwise make every host look lost.
    const std::optional<Trouble> trouble = first_trouble();
    if (!trouble || trouble->record->host != host) continue;
    // A host with one rank could as well have lost just that rank: say so only
    // for a host that had several.
    if (records.size() < 2) continue;
    std::vector<int> ranks;
    for (const RankRecord* record : records) ranks.push_back(record->rank);
    std::sort(ranks.begin(), ranks.end());
    events.push_back(fmt::format("host {} lost: none of its ranks ({}) can be heard (the host died, or its link is "
                                 "down)",
                                 host, fmt::join(ranks, ", ")));
    hosts_named_lost_.push_back(host);
  }
}

std::optional<JobSupervisor::Trouble> JobSupervisor::first_trouble() const {
  std::optional<Clock::time_point> first_end;
  for (const RankRecord& record : ranks_) {
    const bool ended = record.state == RankState::failed || record.state == RankState::lost ||
                       record.state == RankState::exited;
    if (ended && (!first_end || record.ended < *first_end)) first_end = record.ended;
  }
  std::optional<Trouble> first;
  const auto consider = [&](const RankRecord& record, Clock::time_point when, bool silence) {
    if (!first || when < first->when) first = Trouble{.record = &record, .when = when, .silence = silence};
  };
  for (const RankRecord& record : ranks_) {
    if (record.silent_from && (!record.silent_until || !first_end || *record.silent_until >= *first_end)) {
      consider(record, *record.silent_from, true);
    }
    if (record.state == RankState::failed || record.state == RankState::lost || record.state == RankState::exited) {
      consider(record, record.ended, false);
    }
  }
  return first;
}

std::string JobSupervisor::root_cause() const {
  const std::optional<Trouble> trouble = first_trouble();
  if (!trouble) return {};
  const RankRecord* first = trouble->record;
  const double at = seconds_since_start(trouble->when);
  if (trouble->silence) {
    return fmt::format("{} went silent {:.1f} s in: no heartbeat since (stopped, or its host or link is down)",
                       describe(*first), at);
  }
  switch (first->state) {
    case RankState::failed: return fmt::format("{} failed {:.1f} s in: {}", describe(*first), at, first->failure);
    case RankState::lost:
      return fmt::format("{} was lost {:.1f} s in: its lifeline closed with no result (the process was killed, or "
                         "its host went down)",
                         describe(*first), at);
    case RankState::exited: return fmt::format("{} exited {:.1f} s in, before its job ended", describe(*first), at);
    case RankState::running:
    case RankState::silent:
    case RankState::done:
    case RankState::stopped: break;
  }
  return {};
}

std::vector<std::string> JobSupervisor::summary() const {
  std::map<std::string, std::vector<const RankRecord*>> by_host;
  for (const RankRecord& record : ranks_) by_host[record.host].push_back(&record);
  std::vector<std::string> lines;
  for (auto& [host, records] : by_host) {
    std::sort(records.begin(), records.end(),
              [](const RankRecord* a, const RankRecord* b) { return a->rank < b->rank; });
    std::vector<std::string> states;
    for (const RankRecord* record : records) {
      std::string state = fmt::format("rank {} {}", record->rank, rank_state_name(record->state));
      if (record->stopping && record->state != RankState::stopped) state += " (while stopping)";
      if (record->silent_from && record->state != RankState::silent) {
        state += fmt::format(" (silent from {:.1f} s)", seconds_since_start(*record->silent_from));
      }
      states.push_back(std::move(state));
    }
    lines.push_back(fmt::format("{}: {}", host, fmt::join(states, ", ")));
  }
  std::vector<int> missing;
  for (int rank = 0; rank < world_size_; ++rank) {
    if (std::none_of(ranks_.begin(), ranks_.end(), [rank](const RankRecord& record) { return record.rank == rank; })) {
      missing.push_back(rank);
    }
  }
  if (!missing.empty()) {
    lines.push_back(fmt::format("never heard from: rank{} {} (not started, or ended before dist::init)",
                                missing.size() == 1 ? "" : "s", fmt::join(missing, ", ")));
  }
  return lines;
}

}  // namespace tessera::dist
