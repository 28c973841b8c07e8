// JobSupervisor (contract in job_supervisor.h): one poll() over the
// listening socket and every lifeline, each read into a bounded line buffer.
#include "dist/launch/job_supervisor.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/launch/job_secret.h"

namespace tessera::dist {

struct JobSupervisor::Connection {
  Socket socket;
  std::string peer;  // "10.0.0.2:51234": all that is said of a stranger
  Clock::time_point opened;
  std::string input;
  std::optional<size_t> record;  // its place in ranks_, once its hello is accepted
  bool result = false;
};

namespace {

// Reads per connection and poll: one peer that never stops sending cannot
// keep the others waiting.
constexpr int kReadsPerPoll = 16;
constexpr std::chrono::seconds kLifelineAcceptPause{1};
constexpr std::chrono::seconds kRepeatReportInterval{10};
constexpr size_t kMaxHostBytes = 255;
// The ranks never heard from that the summary names; the rest are counted.
constexpr size_t kMissingRanksNamed = 16;

// The kinds of repeatable trouble, as the summary counts them.
constexpr const char* kStrangers = "connections closed without the job secret";
constexpr const char* kRefusedHellos = "hellos refused";
constexpr const char* kUnknownMessages = "lines that are no lifeline message";
constexpr const char* kFailedAccepts = "accepts that failed";
// How many of a kind are logged in full before they are only counted: one
// of what a stranger can do, more of what the job's own processes got wrong.
constexpr int kStrangerLines = 1;
constexpr int kRankLines = 16;

bool parse_int(std::string_view text, int& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

bool is_lost_or_silent(RankState state) { return state == RankState::lost || state == RankState::silent; }

// "10.0.0.2:51234" for an accepted peer, "an unknown peer" if it cannot be named.
std::string peer_name(const sockaddr_storage& address, socklen_t length) {
  char host[NI_MAXHOST] = {};
  char service[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host, service, sizeof service,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown peer";
  }
  return endpoint_name(host, std::atoi(service));
}

// What a hello's secret and host name are made of: printable ASCII, no space.
bool is_word_character(char c) { return c > ' ' && c < 0x7f; }

// The words of a line, at most `limit` of them (a stranger's line was
// bounded before it got here).
std::vector<std::string_view> words_of(std::string_view line, size_t limit) {
  std::vector<std::string_view> words;
  size_t at = 0;
  while (words.size() <= limit) {
    at = line.find_first_not_of(' ', at);
    if (at == std::string_view::npos) break;
    const size_t end = std::min(line.find(' ', at), line.size());
    words.push_back(line.substr(at, end - at));
    at = end;
  }
  return words;
}

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

JobSupervisor::JobSupervisor(JobSupervisorOptions options)
    : options_(std::move(options)), listener_(listen_tcp(options_.address, options_.port)), start_(Clock::now()) {
  TESSERA_CHECK(options_.heartbeat_timeout.count() > 0,
                "JobSupervisor: the heartbeat timeout must be positive, got {} ms", options_.heartbeat_timeout.count());
  TESSERA_CHECK(options_.hello_timeout.count() > 0, "JobSupervisor: the hello timeout must be positive, got {} ms",
                options_.hello_timeout.count());
  TESSERA_CHECK(!options_.job_secret.empty() && options_.job_secret.size() < kMaxHelloBytes / 2 &&
                    std::all_of(options_.job_secret.begin(), options_.job_secret.end(), is_word_character),
                "JobSupervisor: the job secret must be 1 to {} printable characters with no space (it travels in "
                "the hello line), got {} characters",
                kMaxHelloBytes / 2 - 1, options_.job_secret.size());
  port_ = bound_port(listener_);
}

JobSupervisor::~JobSupervisor() = default;

int JobSupervisor::connections() const { return static_cast<int>(connections_.size()); }

int JobSupervisor::open_lifelines() const {
  return static_cast<int>(std::count_if(connections_.begin(), connections_.end(), [](const Connection& connection) {
    return connection.record.has_value() && !connection.result;
  }));
}

int JobSupervisor::pending_connections() const {
  return static_cast<int>(std::count_if(connections_.begin(), connections_.end(),
                                        [](const Connection& connection) { return !connection.record; }));
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

RankRecord& JobSupervisor::record_of(const Connection& connection) { return ranks_[*connection.record]; }

bool JobSupervisor::accepting(Clock::time_point now) const {
  return now >= accepting_paused_until_ && pending_connections() < kMaxPendingConnections;
}

std::vector<std::string> JobSupervisor::poll(std::chrono::milliseconds wait) {
  std::vector<std::string> events;
  const Clock::time_point now = Clock::now();
  // A listener left out of the poll has fd -1 (poll skips it), so that
  // entries[i + 1] stays connections_[i].
  const bool listening = accepting(now);
  if (now < accepting_paused_until_) {
    wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(accepting_paused_until_ - now));
  }
  std::vector<pollfd> entries;
  entries.push_back({.fd = listening ? listener_.fd() : -1, .events = POLLIN, .revents = 0});
  for (const Connection& connection : connections_) {
    entries.push_back({.fd = connection.socket.fd(), .events = POLLIN, .revents = 0});
  }
  const int ready = ::poll(entries.data(), entries.size(), static_cast<int>(wait.count()));
  if (ready < 0 && errno != EINTR) fail("JobSupervisor: poll failed: {}", std::strerror(errno));
  if (ready > 0) {
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
  close_overdue_hellos(events);
  check_silence(options_.heartbeat_timeout, events);
  check_hosts(events);
  return events;
}

std::vector<std::string> JobSupervisor::settle(std::chrono::milliseconds quiet) {
  std::vector<std::string> events = poll(std::chrono::milliseconds(0));
  check_silence(quiet, events);
  check_hosts(events);
  return events;
}

void JobSupervisor::report_repeating(const std::string& kind, const std::string& message, int in_full,
                                     std::vector<std::string>& events) {
  const Clock::time_point now = Clock::now();
  Repeats& repeats = repeats_[kind];
  ++repeats.total;
  if (repeats.total <= in_full) {
    events.push_back(repeats.total < in_full ? message
                                              : message + " (more of these are counted, not each logged)");
    repeats.last_report = now;
    return;
  }
  ++repeats.unreported;
  if (now - repeats.last_report < kRepeatReportInterval) return;
  events.push_back(fmt::format("{} more {} in {:.0f} s ({} in all); the latest: {}", repeats.unreported, kind,
                               std::chrono::duration<double>(now - repeats.last_report).count(), repeats.total,
                               message));
  repeats.unreported = 0;
  repeats.last_report = now;
}

void JobSupervisor::accept_waiting(std::vector<std::string>& events) {
  while (pending_connections() < kMaxPendingConnections) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd =
        ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&address), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // EMFILE, ENFILE, ENOBUFS: the connection stays in the backlog and the
      // listener stays readable, so polling it again at once would spin.
      const int error = errno;
      accepting_paused_until_ = Clock::now() + kLifelineAcceptPause;
      report_repeating(kFailedAccepts,
                       fmt::format("cannot accept a lifeline: {} (holding {} connections); not accepting for {} s",
                                   std::strerror(error), connections_.size(), kLifelineAcceptPause.count()),
                       kStrangerLines, events);
      return;
    }
    Connection connection;
    connection.socket = Socket(fd);
    connection.peer = peer_name(address, length);
    connection.opened = Clock::now();
    connections_.push_back(std::move(connection));
  }
}

bool JobSupervisor::read_from(Connection& connection, std::vector<std::string>& events) {
  char buffer[4096];
  for (int reads = 0; reads < kReadsPerPoll; ++reads) {
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
      if (!handle_line(connection, line, events)) return false;
    }
    if (!connection.record && connection.input.size() > kMaxHelloBytes) {
      report_repeating(kStrangers,
                       fmt::format("a connection from {} sent over {} bytes without a hello: closed, nothing taken "
                                   "from it",
                                   connection.peer, kMaxHelloBytes),
                       kStrangerLines, events);
      return false;
    }
    if (connection.input.size() > kMaxLineBytes) {
      events.push_back(fmt::format("{} sent a line over {} KiB: not a lifeline's; its connection is closed",
                                   describe(record_of(connection)), kMaxLineBytes / 1024));
      return false;
    }
  }
  return true;
}

bool JobSupervisor::accept_hello(Connection& connection, const std::string& line, std::vector<std::string>& events) {
  // hello <secret> <rank> <world size> <pid> <host>: the secret first, and
  // nothing else read from a line without it.
  const std::vector<std::string_view> words = words_of(line, 6);
  if (words.size() < 2 || words[0] != "hello" || !is_job_secret(words[1], options_.job_secret)) {
    report_repeating(kStrangers,
                     fmt::format("a connection from {} did not present the job secret: closed, nothing taken from it",
                                 connection.peer),
                     kStrangerLines, events);
    return false;
  }
  const auto refuse = [&](const std::string& why) {
    report_repeating(kRefusedHellos, fmt::format("a hello from {} refused: {}", connection.peer, why), kRankLines,
                     events);
    return false;
  };
  int rank = 0, size = 0, pid = 0;
  if (words.size() != 6 || !parse_int(words[2], rank) || !parse_int(words[3], size) || !parse_int(words[4], pid)) {
    return refuse("not 'hello <secret> <rank> <world size> <pid> <host>'");
  }
  const std::string_view host = words[5];
  if (host.size() > kMaxHostBytes || !std::all_of(host.begin(), host.end(), is_word_character) || pid < 1) {
    return refuse(fmt::format("pid {} or a host name of {} bytes is not a process's", pid, host.size()));
  }
  const std::string who = fmt::format("rank {} on {} (pid {})", rank, host, pid);
  if (size < 1 || size > kMaxWorldSize) {
    return refuse(fmt::format("{} says the world has {} ranks; a job has 1 to {}", who, size, kMaxWorldSize));
  }
  if (world_size_ != 0 && size != world_size_) {
    return refuse(fmt::format("{} says the world has {} ranks; the job's first hello said {}", who, size,
                              world_size_));
  }
  if (rank < 0 || rank >= size) return refuse(fmt::format("{} is outside a world of {}", who, size));
  if (const auto earlier = record_index_.find(rank); earlier != record_index_.end()) {
    const RankRecord& first = ranks_[earlier->second];
    return refuse(fmt::format("rank {} said hello twice: from {} (pid {}), now from {} (pid {})", rank, first.host,
                              first.pid, host, pid));
  }
  world_size_ = size;
  RankRecord record;
  record.rank = rank;
  record.pid = pid;
  record.host = std::string(host);
  record.last_heard = Clock::now();
  connection.record = ranks_.size();
  record_index_[rank] = ranks_.size();
  ranks_.push_back(std::move(record));
  return true;
}

bool JobSupervisor::handle_line(Connection& connection, const std::string& line, std::vector<std::string>& events) {
  if (!connection.record) return accept_hello(connection, line, events);
  const Clock::time_point now = Clock::now();
  RankRecord& record = record_of(connection);
  record.last_heard = now;
  if (record.state == RankState::silent) {
    record.state = RankState::running;
    if (!record.silent_until) record.silent_until = now;
    events.push_back(fmt::format("{} answers again", describe(record)));
  }
  if (line == "beat") return true;
  if (connection.result) return true;  // a rank's first result stands
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
    return true;
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
    report_repeating(kUnknownMessages,
                     fmt::format("{} sent '{}': not a lifeline message; ignored", describe(record),
                                 line.substr(0, 200)),
                     kRankLines, events);
    return true;
  }
  connection.result = true;
  record.ended = now;
  return true;
}

void JobSupervisor::close_overdue_hellos(std::vector<std::string>& events) {
  const Clock::time_point now = Clock::now();
  std::erase_if(connections_, [&](const Connection& connection) {
    if (connection.record || now - connection.opened <= options_.hello_timeout) return false;
    report_repeating(kStrangers,
                     fmt::format("a connection from {} said no hello within {:.1f} s: closed", connection.peer,
                                 std::chrono::duration<double>(options_.hello_timeout).count()),
                     kStrangerLines, events);
    return true;
  });
}

void JobSupervisor::end_connection(Connection& connection, std::vector<std::string>& events) {
  if (!connection.record || connection.result) return;
  RankRecord& record = record_of(connection);
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
    if (!connection.record || connection.result) continue;
    RankRecord& record = record_of(connection);
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
  // The ranks never heard from: the gaps between the ranks heard (by
  // record_index_, in rank order), named up to a handful and then counted.
  const int64_t missing = world_size_ - static_cast<int64_t>(ranks_.size());
  if (missing > 0) {
    std::vector<int> named;
    int next = 0;
    for (const auto& [rank, index] : record_index_) {
      for (; next < rank && named.size() < kMissingRanksNamed; ++next) named.push_back(next);
      next = rank + 1;
    }
    for (; next < world_size_ && named.size() < kMissingRanksNamed; ++next) named.push_back(next);
    const int64_t unnamed = missing - static_cast<int64_t>(named.size());
    const std::string more = unnamed > 0 ? fmt::format(" and {} more", unnamed) : "";
    lines.push_back(fmt::format("never heard from: rank{} {}{} (not started, or ended before dist::init)",
                                missing == 1 ? "" : "s", fmt::join(named, ", "), more));
  }
  for (const auto& [kind, repeats] : repeats_) lines.push_back(fmt::format("{}: {}", kind, repeats.total));
  return lines;
}

}  // namespace tessera::dist
