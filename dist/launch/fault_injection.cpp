// The fault plan (contract in fault_injection.h): parsed once, counted per
// (point, rank) under one lock, which only runs where a plan exists.
#include "dist/launch/fault_injection.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace tessera::dist {
namespace {

constexpr std::pair<std::string_view, FaultAction> kActions[] = {
    {"kill", FaultAction::kill}, {"delay", FaultAction::delay}, {"fail", FaultAction::fail},
    {"corrupt", FaultAction::corrupt}, {"disconnect", FaultAction::disconnect}};
constexpr std::pair<std::string_view, FaultPoint> kPoints[] = {{"collective", FaultPoint::collective},
                                                               {"checkpoint_write", FaultPoint::checkpoint_write},
                                                               {"checkpoint_commit", FaultPoint::checkpoint_commit},
                                                               {"data", FaultPoint::data}};
constexpr std::pair<std::string_view, int> kErrnos[] = {
    {"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}, {"ENOMEM", ENOMEM}};

template <typename Value, size_t N>
std::string_view name_of(const std::pair<std::string_view, Value> (&table)[N], Value value) {
  for (const auto& [name, entry] : table) {
    if (entry == value) return name;
  }
  return "?";
}

template <typename Value, size_t N>
std::optional<Value> value_named(const std::pair<std::string_view, Value> (&table)[N], std::string_view name) {
  for (const auto& [entry_name, value] : table) {
    if (entry_name == name) return value;
  }
  return std::nullopt;
}

template <typename Value, size_t N>
std::string names_of(const std::pair<std::string_view, Value> (&table)[N]) {
  std::string names;
  for (const auto& [name, entry] : table) names += (names.empty() ? "" : ", ") + std::string(name);
  return names;
}

// The actions each point takes.
bool takes(FaultPoint point, FaultAction action) {
  switch (point) {
    case FaultPoint::collective:
      return action == FaultAction::kill || action == FaultAction::delay || action == FaultAction::disconnect;
    case FaultPoint::checkpoint_write:
      return action == FaultAction::fail || action == FaultAction::corrupt;
    case FaultPoint::checkpoint_commit:
      return action == FaultAction::kill;
    case FaultPoint::data:
      return action == FaultAction::fail;
  }
  return false;
}

int64_t parse_integer(std::string_view fault, std::string_view key, std::string_view text, int64_t min) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  TESSERA_CHECK(error == std::errc() && end == text.data() + text.size() && value >= min,
                "TESSERA_FAULT: '{}': {}={} must be an integer >= {}", fault, key, text, min);
  return value;
}

Fault parse_fault(std::string_view text) {
  const size_t at_sign = text.find('@');
  TESSERA_CHECK(at_sign != std::string_view::npos, "TESSERA_FAULT: '{}' is not ACTION@POINT[,KEY=VALUE...]", text);
  const std::string_view action = text.substr(0, at_sign);
  std::string_view rest = text.substr(at_sign + 1);
  const size_t comma = rest.find(',');
  const std::string_view point = rest.substr(0, comma);
  rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);

  Fault fault;
  const std::optional<FaultAction> known_action = value_named(kActions, action);
  TESSERA_CHECK(known_action, "TESSERA_FAULT: '{}': no action '{}' ({})", text, action, names_of(kActions));
  const std::optional<FaultPoint> known_point = value_named(kPoints, point);
  TESSERA_CHECK(known_point, "TESSERA_FAULT: '{}': no point '{}' ({})", text, point, names_of(kPoints));
  fault.action = *known_action;
  fault.point = *known_point;
  TESSERA_CHECK(takes(fault.point, fault.action), "TESSERA_FAULT: '{}': {} cannot {}", text, point, action);

  bool has_seconds = false;
  std::vector<std::string_view> keys_given;
  while (!rest.empty()) {
    const size_t end = rest.find(',');
    const std::string_view pair = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    const size_t equals = pair.find('=');
    TESSERA_CHECK(equals != std::string_view::npos, "TESSERA_FAULT: '{}': '{}' is not KEY=VALUE", text, pair);
    const std::string_view key = pair.substr(0, equals), value = pair.substr(equals + 1);
    // A second value would silently win over the first.
    TESSERA_CHECK(std::find(keys_given.begin(), keys_given.end(), key) == keys_given.end(),
                  "TESSERA_FAULT: '{}': {} is given twice", text, key);
    keys_given.push_back(key);
    if (key == "rank") {
      fault.rank = static_cast<int>(parse_integer(text, key, value, 0));
    } else if (key == "at") {
      fault.at = parse_integer(text, key, value, 1);
    } else if (key == "seconds" && fault.action == FaultAction::delay) {
      char* stop = nullptr;
      const std::string copy(value);
      fault.seconds = std::strtod(copy.c_str(), &stop);
      TESSERA_CHECK(!copy.empty() && *stop == '\0' && fault.seconds > 0.0 && fault.seconds <= 3600.0,
                    "TESSERA_FAULT: '{}': seconds={} must be a number in (0, 3600]", text, value);
      has_seconds = true;
    } else if (key == "errno" && fault.action == FaultAction::fail) {
      const std::optional<int> number = value_named(kErrnos, value);
      TESSERA_CHECK(number, "TESSERA_FAULT: '{}': errno={} is not one of {}", text, value, names_of(kErrnos));
      fault.error_number = *number;
    } else {
      fail("TESSERA_FAULT: '{}': {} takes no key '{}'", text, action, key);
    }
  }
  TESSERA_CHECK(fault.action != FaultAction::delay || has_seconds, "TESSERA_FAULT: '{}': a delay needs seconds=S",
                text);
  TESSERA_CHECK(fault.action != FaultAction::fail || fault.error_number != 0,
                "TESSERA_FAULT: '{}': a fail needs errno=NAME ({})", text, names_of(kErrnos));
  return fault;
}

struct Plan {
  std::mutex mutex;
  bool loaded = false;
  std::vector<Fault> faults;
  std::map<std::pair<FaultPoint, int>, int64_t> arrivals;
};

Plan& plan() {
  static Plan instance;
  return instance;
}

// Whether any fault is planned, without the lock: the common case is none.
std::atomic<int> g_planned{-1};  // -1: TESSERA_FAULT not read yet

// Reads TESSERA_FAULT unless a plan is loaded (the caller holds the lock).
void load_plan(Plan& state) {
  if (state.loaded) return;
  const char* text = std::getenv("TESSERA_FAULT");
  state.faults = parse_faults(text ? text : "");
  state.loaded = true;
  g_planned = state.faults.empty() ? 0 : 1;
}

// A host losing its network, as its peers see it: every TCP socket of this
// process (its MPI links, its launcher's lifeline, a store's) is shut down
// in both directions; the process goes on with what it has. Returns how many.
int shut_down_tcp_sockets() {
  int count = 0;
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (descriptors == nullptr) return 0;
  std::vector<int> fds;
  while (const dirent* entry = ::readdir(descriptors)) {
    int fd = -1;
    const std::string_view name(entry->d_name);
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec == std::errc() && fd != ::dirfd(descriptors)) {
      fds.push_back(fd);
    }
  }
  ::closedir(descriptors);
  for (const int fd : fds) {
    int domain = 0, type = 0;
    socklen_t length = sizeof domain;
    if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) != 0) continue;  // not a socket
    length = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0) continue;
    if ((domain == AF_INET || domain == AF_INET6) && type == SOCK_STREAM && ::shutdown(fd, SHUT_RDWR) == 0) ++count;
  }
  return count;
}

}  // namespace

std::string Fault::to_string() const {
  std::string text = fmt::format("{}@{}", name_of(kActions, action), name_of(kPoints, point));
  if (rank) text += fmt::format(",rank={}", *rank);
  text += fmt::format(",at={}", at);
  if (action == FaultAction::delay) text += fmt::format(",seconds={}", seconds);
  if (action == FaultAction::fail) text += fmt::format(",errno={}", name_of(kErrnos, error_number));
  return text;
}

std::vector<Fault> parse_faults(std::string_view text) {
  std::vector<Fault> faults;
  while (!text.empty()) {
    const size_t end = text.find(';');
    const std::string_view one = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!one.empty()) faults.push_back(parse_fault(one));
  }
  return faults;
}

void set_faults(std::vector<Fault> faults) {
  Plan& state = plan();
  std::lock_guard lock(state.mutex);
  state.faults = std::move(faults);
  state.arrivals.clear();
  state.loaded = true;
  g_planned = state.faults.empty() ? 0 : 1;
}

void check_faults_fit_world(int world_size) {
  if (g_planned.load(std::memory_order_relaxed) == 0) return;
  Plan& state = plan();
  std::lock_guard lock(state.mutex);
  load_plan(state);
  for (const Fault& fault : state.faults) {
    TESSERA_CHECK(!fault.rank || *fault.rank < world_size,
                  "TESSERA_FAULT: '{}': rank={} is outside this world of {} ranks (0 to {}), so it would never fire",
                  fault.to_string(), *fault.rank, world_size, world_size - 1);
  }
}

std::optional<Fault> fault_at(FaultPoint point, int rank) {
  if (g_planned.load(std::memory_order_relaxed) == 0) return std::nullopt;
  Plan& state = plan();
  std::lock_guard lock(state.mutex);
  load_plan(state);
  if (state.faults.empty()) return std::nullopt;
  const int64_t arrival = ++state.arrivals[{point, rank}];
  for (const Fault& fault : state.faults) {
    if (fault.point == point && (!fault.rank || *fault.rank == rank) && fault.at == arrival) return fault;
  }
  return std::nullopt;
}

void carry_out(const Fault& fault, std::string_view where, bool rank_is_process) {
  if (fault.action == FaultAction::delay) {
    std::this_thread::sleep_for(std::chrono::duration<double>(fault.seconds));
    return;
  }
  TESSERA_CHECK(fault.action == FaultAction::kill || fault.action == FaultAction::disconnect,
                "carry_out: {} is the point's own to carry out", fault.to_string());
  if (fault.action == FaultAction::disconnect && rank_is_process) {
    const int connections = shut_down_tcp_sockets();
    std::fprintf(stderr, "tessera: injected fault %s: shut down the %d TCP sockets of this process at %.*s\n",
                 fault.to_string().c_str(), connections, static_cast<int>(where.size()), where.data());
    std::fflush(stderr);
    return;
  }
  if (rank_is_process) {
    std::fprintf(stderr, "tessera: injected fault %s: killing this process at %.*s\n", fault.to_string().c_str(),
                 static_cast<int>(where.size()), where.data());
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  throw InjectedFault(fmt::format("injected fault {}: the rank died at {}", fault.to_string(), where));
}

std::string describe_errno(int error_number) {
  return fmt::format("{} ({})", std::strerror(error_number), name_of(kErrnos, error_number));
}

}  // namespace tessera::dist
