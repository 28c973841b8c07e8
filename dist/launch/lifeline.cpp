// Lifeline (contract in lifeline.h): one blocking socket, written by the
// heartbeat thread and by whichever thread reports the rank's end, one
// line at a time under send_mutex_. Nothing is ever read from it.
#include "dist/launch/lifeline.h"

#include <unistd.h>

#include <charconv>
#include <memory>

#include <fmt/format.h>

#include "dist/launch/job_secret.h"

namespace tessera::dist {
namespace {

constexpr std::chrono::seconds kSendLimit{1};

std::string one_line(std::string_view text) {
  std::string line;
  line.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') {
      if (i + 1 < text.size()) line += " | ";
    } else if (text[i] != '\r') {
      line += text[i];
    }
  }
  return line;
}

// The host name as the hello line carries it.
std::string hello_host_name() {
  std::string host = host_name();
  for (char& c : host) {
    if (c == ' ') c = '_';  // the hello line is space-separated
  }
  return host;
}

// Where a launcher that judged the whole job to be on its host listens.
bool is_loopback_name(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

// A process may join several jobs in turn (test programs call dist::init
// once per case): one lifeline serves them all, and its result goes out
// when the process exits, "done" if the last of them ended cleanly.
struct ProcessLifeline {
  std::unique_ptr<Lifeline> lifeline;
  bool ended_cleanly = false;
  ~ProcessLifeline() {
    if (lifeline && ended_cleanly) lifeline->report_done();
  }
};
std::mutex process_lifeline_mutex;
ProcessLifeline process_lifeline;

}  // namespace

std::pair<std::string, int> parse_endpoint(std::string_view value, std::string_view variable) {
  const auto malformed = [&]() -> std::pair<std::string, int> {
    fail("{}='{}' is not host:port (an IPv6 address in brackets: [::1]:29400)", variable, value);
  };
  const size_t colon = value.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == value.size()) return malformed();
  std::string_view host = value.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return malformed();
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return malformed();
  }
  const std::string_view port_text = value.substr(colon + 1);
  int port = 0;
  const auto [end, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (error != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535) {
    return malformed();
  }
  return {std::string(host), port};
}

Lifeline::Lifeline(const std::string& endpoint, const std::string& job_secret, LifelineIdentity identity,
                   std::chrono::milliseconds heartbeat_interval, std::chrono::milliseconds connect_timeout) {
  TESSERA_CHECK(heartbeat_interval.count() > 0, "Lifeline: the heartbeat interval must be positive, got {} ms",
                heartbeat_interval.count());
  const auto [host, port] = parse_endpoint(endpoint, kLauncherVariable);
  try {
    socket_ = connect_tcp(host, port, Clock::now() + connect_timeout);
  } catch (const Error& error) {
    if (!is_loopback_name(host)) throw;
    fail("{} (the launcher listens on loopback when it judges the whole job to run on its own host; for ranks on "
         "other hosts give it --address)",
         error.what());
  }
  const std::string hello = fmt::format("hello {} {} {} {} {}", job_secret, identity.rank, identity.world_size,
                                        identity.pid, identity.host);
  if (!send_line(hello)) fail("Lifeline: the launcher at {} closed the connection before the hello", endpoint);
  heartbeat_ = std::thread([this, heartbeat_interval] { beat_until_stopped(heartbeat_interval); });
}

Lifeline::~Lifeline() {
  stop_heartbeat();
  std::lock_guard lock(send_mutex_);
  if (!result_sent_) send_locked("exited");
}

bool Lifeline::send_line(const std::string& line) {
  std::lock_guard lock(send_mutex_);
  return send_locked(line);
}

bool Lifeline::send_locked(const std::string& line) {
  if (!socket_.valid()) return false;
  const std::string framed = line + "\n";
  try {
    send_all(socket_, std::as_bytes(std::span(framed)), Clock::now() + kSendLimit, "lifeline");
    return true;
  } catch (const Error&) {
    socket_ = Socket();  // the launcher is gone: nobody is left to tell
    return false;
  }
}

void Lifeline::beat_until_stopped(std::chrono::milliseconds interval) {
  std::unique_lock lock(stop_mutex_);
  while (!stop_signal_.wait_for(lock, interval, [this] { return stopping_; })) {
    lock.unlock();
    const bool sent = send_line("beat");
    lock.lock();
    if (!sent) return;
  }
}

void Lifeline::stop_heartbeat() {
  {
    std::lock_guard lock(stop_mutex_);
    stopping_ = true;
  }
  stop_signal_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

// The heartbeat goes on after a failure: the rank is alive until MPI_Abort ends it.
void Lifeline::report_failure(std::string_view message) {
  std::lock_guard lock(send_mutex_);
  if (result_sent_) return;
  result_sent_ = true;
  send_locked("failed " + one_line(message));
}

void Lifeline::report_stopping() {
  std::lock_guard lock(send_mutex_);
  if (result_sent_ || stopping_sent_) return;
  stopping_sent_ = true;
  send_locked("stopping");
}

void Lifeline::report_done() {
  stop_heartbeat();
  std::lock_guard lock(send_mutex_);
  if (result_sent_) return;
  result_sent_ = true;
  send_locked("done");
  socket_ = Socket();
}

void open_process_lifeline(int rank, int world_size, const EnvironmentLookup& environment) {
  const std::optional<std::string> endpoint = environment(kLauncherVariable);
  if (!endpoint || endpoint->empty()) return;
  const std::optional<std::string> secret = job_secret_from(environment);
  TESSERA_CHECK(secret.has_value(),
                "{} is set but {} is not: the launcher sets both (and forwards both with mpirun's -x); a rank "
                "without the secret cannot join its lifelines",
                kLauncherVariable, kJobSecretVariable);
  std::lock_guard lock(process_lifeline_mutex);
  process_lifeline.ended_cleanly = false;
  if (process_lifeline.lifeline) return;
  process_lifeline.lifeline = std::make_unique<Lifeline>(
      *endpoint, *secret,
      LifelineIdentity{.rank = rank, .world_size = world_size, .pid = ::getpid(), .host = hello_host_name()},
      std::chrono::seconds(1), std::chrono::seconds(30));
}

void report_failure_to_launcher(std::string_view message) {
  std::lock_guard lock(process_lifeline_mutex);
  if (process_lifeline.lifeline) process_lifeline.lifeline->report_failure(message);
}

void report_stopping_to_launcher() {
  std::lock_guard lock(process_lifeline_mutex);
  if (process_lifeline.lifeline) process_lifeline.lifeline->report_stopping();
}

void report_clean_end_to_launcher() {
  std::lock_guard lock(process_lifeline_mutex);
  process_lifeline.ended_cleanly = true;
}

}  // namespace tessera::dist
