// TcpStoreServer (contract in tcp_store_server.h). One poll() loop over the
// listening socket, a wake pipe and every connection (StoreService), over
// the keys and values and what each request does to them (StoreState).
// Each connection has an input buffer (requests may arrive in pieces; at
// most its largest request waits there) and an output buffer holding one
// reply at a time (its next request is handled once the last reply has
// gone out), so a slow or stalled client never blocks the others and none
// can make the server buffer without bound. A get of a missing key parks
// the connection in `waiters` until a set or add creates the key.
#include "dist/launch/tcp_store_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/launch/job_secret.h"

namespace tessera::dist {
namespace {

namespace protocol = store_protocol;
using Bytes = std::vector<std::byte>;

// How long the listener rests when the process is out of descriptors, rather
// than poll() waking at once on the connection it cannot accept.
constexpr auto kStoreAcceptPause = std::chrono::milliseconds(100);

struct Connection {
  Socket socket;
  bool admitted = false;         // presented the job secret (or the store has none)
  Clock::time_point admit_by{};  // closed when not admitted by then
  Bytes input{};
  Bytes output{};
  size_t output_sent = 0;
  bool input_full = false;  // the input holds its bound and more bytes wait in the socket
  bool parked = false;      // waiting in a get
  bool close_after = false; // refused: flush the refusal, then close
};

void append(Bytes& out, std::span<const std::byte> bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); }

void reply(Connection& connection, protocol::Status status, std::span<const std::byte> payload) {
  append(connection.output, protocol::encode_reply(status, payload.size()));
  append(connection.output, payload);
}

void refuse(Connection& connection, const std::string& message) {
  reply(connection, protocol::Status::refused, std::as_bytes(std::span(message)));
  connection.close_after = true;
}

// A key as messages show it: at most 64 bytes of it.
std::string shown(const std::string& key) {
  return key.size() <= 64 ? key : fmt::format("{}...", std::string_view(key).substr(0, 64));
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

const std::string kUnauthenticated =
    "TcpStoreServer: this store admits only its job's processes: a connection presents the job secret (" +
    std::string(kJobSecretVariable) + ") before anything else";
const std::string kWrongSecret = "TcpStoreServer: wrong job secret: this store admits only its job's processes (" +
                                 std::string(kJobSecretVariable) + " must be the same for every rank)";
const std::string kNoSecret = "TcpStoreServer: this store has no job secret (rank 0 started it without " +
                              std::string(kJobSecretVariable) +
                              "): set the same secret for every rank, or for none when all are on one host";

// The keys and values, and every request's effect on them; owned by the
// serving thread.
class StoreState {
 public:
  StoreState(std::optional<std::string> secret, StoreLimits limits)
      : secret_(std::move(secret)), limits_(limits) {}

  bool has_secret() const { return secret_.has_value(); }

  // The bytes that may wait on a connection: one authenticate until it is
  // admitted, its largest request after.
  uint64_t input_bound(const Connection& connection) const {
    return connection.admitted ? limits_.max_input_bytes() : protocol::kRequestHeaderBytes + kLongestJobSecret;
  }

  // Handles the complete requests at the front of `connection.input`, one at
  // a time: it stops at a parked get, a refusal or a reply not yet sent.
  // Returns whether it handled any.
  bool handle_input(uint64_t id, Connection& connection) {
    size_t consumed = 0;
    bool handled = false;
    while (!connection.parked && !connection.close_after && connection.output.empty()) {
      const std::span<const std::byte> rest = std::span(connection.input).subspan(consumed);
      if (rest.size() < protocol::kRequestHeaderBytes) break;
      const protocol::RequestHeader header = protocol::decode_request(rest.first<protocol::kRequestHeaderBytes>());
      if (const std::optional<std::string> refusal = refusal_of(header, connection.admitted)) {
        refuse(connection, *refusal);
        handled = true;
        break;
      }
      const size_t total = protocol::kRequestHeaderBytes + header.key_bytes + header.value_bytes;
      if (rest.size() < total) break;
      const auto* key_begin = reinterpret_cast<const char*>(rest.data() + protocol::kRequestHeaderBytes);
      std::string key(key_begin, header.key_bytes);
      const std::span<const std::byte> value =
          rest.subspan(protocol::kRequestHeaderBytes + header.key_bytes, header.value_bytes);
      consumed += total;
      handled = true;
      if (connection.admitted) {
        handle(id, connection, header.op, std::move(key), value);
      } else {
        admit(connection, key);
      }
    }
    connection.input.erase(connection.input.begin(), connection.input.begin() + static_cast<ptrdiff_t>(consumed));
    return handled;
  }

  // Replies to the connections parked on the keys sets and adds wrote.
  void release_waiters(std::map<uint64_t, Connection>& connections) {
    for (const std::string& key : std::exchange(changed_keys_, {})) {
      const auto waiting = waiters_.find(key);
      if (waiting == waiters_.end()) continue;
      for (const uint64_t id : waiting->second) {
        const auto connection = connections.find(id);
        if (connection == connections.end() || connection->second.close_after) continue;
        reply(connection->second, protocol::Status::ok, values_.at(key));
        connection->second.parked = false;
      }
      waiters_.erase(waiting);
    }
  }

  void forget(uint64_t id) {
    for (auto waiting = waiters_.begin(); waiting != waiters_.end();) {
      std::erase(waiting->second, id);
      waiting = waiting->second.empty() ? waiters_.erase(waiting) : std::next(waiting);
    }
  }

  uint64_t held_bytes() const { return held_bytes_; }
  int64_t parked_gets() const {
    int64_t parked = 0;
    for (const auto& [key, ids] : waiters_) parked += static_cast<int64_t>(ids.size());
    return parked;
  }

 private:
  // Why a request is refused from its header alone, before its body is
  // read; nothing when it may be read.
  std::optional<std::string> refusal_of(const protocol::RequestHeader& header, bool admitted) const {
    if (!admitted) {
      if (header.op != protocol::Op::authenticate) return kUnauthenticated;
      if (header.key_bytes > kLongestJobSecret || header.value_bytes != 0) return kWrongSecret;
      return std::nullopt;
    }
    switch (header.op) {
      case protocol::Op::authenticate:
        return secret_ ? "TcpStoreServer: this connection has already presented the job secret" : kNoSecret;
      case protocol::Op::set:
      case protocol::Op::get:
      case protocol::Op::add:
      case protocol::Op::check: break;
      default: return fmt::format("TcpStoreServer: unknown request op {}", static_cast<int>(header.op));
    }
    if (header.key_bytes == 0) return "TcpStoreServer: a request with an empty key";
    if (header.key_bytes > limits_.max_key_bytes) {
      return fmt::format("TcpStoreServer: a key of {} bytes is above the bound of {} bytes a key (max_key_bytes)",
                         header.key_bytes, limits_.max_key_bytes);
    }
    if (header.value_bytes > limits_.max_value_bytes) {
      return fmt::format(
          "TcpStoreServer: a value of {} bytes is above the bound of {} bytes a value (max_value_bytes)",
          header.value_bytes, limits_.max_value_bytes);
    }
    if (header.op == protocol::Op::set && header.key_bytes + header.value_bytes > limits_.max_total_bytes) {
      return fmt::format(
          "TcpStoreServer: a key and value of {} bytes are above the bound of {} bytes the store holds in all "
          "(max_total_bytes)",
          header.key_bytes + header.value_bytes, limits_.max_total_bytes);
    }
    return std::nullopt;
  }

  void admit(Connection& connection, const std::string& presented) {
    if (!is_job_secret(presented, *secret_)) return refuse(connection, kWrongSecret);
    connection.admitted = true;
    reply(connection, protocol::Status::ok, {});
  }

  // Whether `key` may hold `value_bytes` (replacing what it holds) within
  // max_total_bytes; refuses the request, naming the bound, when not.
  bool fits(Connection& connection, const char* op, const std::string& key, uint64_t value_bytes) {
    const auto existing = values_.find(key);
    const uint64_t freed = existing == values_.end() ? 0 : key.size() + existing->second.size();
    const uint64_t after = held_bytes_ - freed + key.size() + value_bytes;
    if (after <= limits_.max_total_bytes) return true;
    refuse(connection, fmt::format("TcpStoreServer: {}('{}') would make the store hold {} bytes, above the bound of "
                                   "{} bytes in all (max_total_bytes)",
                                   op, shown(key), after, limits_.max_total_bytes));
    return false;
  }

  void store(const std::string& key, Bytes value) {
    Bytes& stored = values_[key];
    held_bytes_ = held_bytes_ - stored.size() + value.size();
    stored = std::move(value);
  }

  void handle(uint64_t id, Connection& connection, protocol::Op op, std::string key, std::span<const std::byte> value) {
    switch (op) {
      case protocol::Op::set:
        if (!fits(connection, "set", key, value.size())) return;
        if (!values_.contains(key)) held_bytes_ += key.size();
        store(key, Bytes(value.begin(), value.end()));
        changed_keys_.push_back(key);
        reply(connection, protocol::Status::ok, {});
        return;
      case protocol::Op::get: {
        const auto found = values_.find(key);
        if (found != values_.end()) {
          reply(connection, protocol::Status::ok, found->second);
        } else {
          waiters_[key].push_back(id);
          connection.parked = true;
        }
        return;
      }
      case protocol::Op::add: {
        if (value.size() != 8) return refuse(connection, "TcpStoreServer: add('" + shown(key) + "') needs an 8-byte delta");
        const auto found = values_.find(key);
        if (found != values_.end() && found->second.size() != 8) {
          return refuse(connection, fmt::format("TcpStoreServer: add('{}'): the key holds {} bytes set by set(), not "
                                                "a counter",
                                                shown(key), found->second.size()));
        }
        if (found == values_.end()) {
          if (!fits(connection, "add", key, 8)) return;
          held_bytes_ += key.size();
        }
        const uint64_t old_value = found == values_.end() ? 0 : protocol::get_le(found->second.data(), 8);
        Bytes sum(8);
        protocol::put_le(sum.data(), old_value + protocol::get_le(value.data(), 8), 8);  // two's complement i64
        store(key, sum);
        changed_keys_.push_back(key);
        reply(connection, protocol::Status::ok, sum);
        return;
      }
      case protocol::Op::check: {
        const std::byte present{values_.contains(key) ? uint8_t{1} : uint8_t{0}};
        reply(connection, protocol::Status::ok, std::span(&present, 1));
        return;
      }
      case protocol::Op::authenticate: break;  // refused from its header
    }
  }

  std::optional<std::string> secret_;
  StoreLimits limits_;
  std::map<std::string, Bytes> values_;
  uint64_t held_bytes_ = 0;  // keys and values
  std::map<std::string, std::vector<uint64_t>> waiters_;
  std::vector<std::string> changed_keys_;
};

// Reads what the connection has, up to `bound` bytes waiting in its input;
// false when it closed or failed. Sets input_full when the bound is reached
// and more bytes wait in the socket (they stay there, unread).
bool read_available(Connection& connection, uint64_t bound) {
  std::byte buffer[64 * 1024];
  while (connection.input.size() < bound) {
    const size_t room = static_cast<size_t>(std::min<uint64_t>(sizeof buffer, bound - connection.input.size()));
    const ssize_t count = ::recv(connection.socket.fd(), buffer, room, MSG_DONTWAIT);
    if (count > 0) {
      append(connection.input, std::span(buffer, static_cast<size_t>(count)));
      continue;
    }
    if (count == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  std::byte more{};
  const ssize_t waiting = ::recv(connection.socket.fd(), &more, 1, MSG_DONTWAIT | MSG_PEEK);
  connection.input_full = waiting > 0;
  return waiting != 0;
}

// Sends what the socket takes; false when the connection failed.
bool write_pending(Connection& connection) {
  while (connection.output_sent < connection.output.size()) {
    const ssize_t count = ::send(connection.socket.fd(), connection.output.data() + connection.output_sent,
                                 connection.output.size() - connection.output_sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (count < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    connection.output_sent += static_cast<size_t>(count);
  }
  connection.output.clear();
  connection.output_sent = 0;
  return true;
}

// Refuses a connection over the bound at once: the refusal is what its
// first request reads back (a few bytes: the new socket's buffer takes them).
// What the client has sent already is read first, so that the close does not
// reset the connection and lose the refusal on its way.
void refuse_connection(Socket socket, const std::string& message) {
  Connection connection{.socket = std::move(socket)};
  std::byte sent_already[4096];
  while (::recv(connection.socket.fd(), sent_already, sizeof sent_already, MSG_DONTWAIT) < 0 && errno == EINTR) {
  }
  refuse(connection, message);
  write_pending(connection);
}

void log_line(int port, const std::string& message) {
  std::fprintf(stderr, "tessera TcpStoreServer on port %d: %s\n", port, message.c_str());
  std::fflush(stderr);
}

// Milliseconds poll() may wait until `deadline` (at least 0).
int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// The serving thread's connections and store, and the steps of one turn
// of its poll() loop, in the order serve() takes them.
class StoreService {
 public:
  using Stats = TcpStoreServer::Stats;

  StoreService(int listener, int port, std::optional<std::string> secret, StoreLimits limits,
               std::function<void(const Stats&)> publish)
      : listener_(listener), port_(port), limits_(limits), state_(std::move(secret), limits),
        publish_(std::move(publish)) {}

  // Fills `polled` with the wake pipe, the listener (-1 while it rests) and
  // every connection; returns how long poll() may wait: until the next
  // deadline (the listener's rest, a connection's admission), or for ever.
  int poll_list(int wake, std::vector<pollfd>& polled) {
    const bool accepting = Clock::now() >= accept_paused_until_;
    std::optional<Clock::time_point> next_deadline;
    if (!accepting) next_deadline = accept_paused_until_;
    polled.assign({pollfd{.fd = wake, .events = POLLIN, .revents = 0},
                   pollfd{.fd = accepting ? listener_ : -1, .events = POLLIN, .revents = 0}});
    polled_ids_.clear();
    for (auto& [id, connection] : connections_) {
      const short reading = connection.close_after ? 0 : POLLIN;
      const short events = static_cast<short>(reading | (connection.output.empty() ? 0 : POLLOUT));
      polled.push_back({.fd = connection.socket.fd(), .events = events, .revents = 0});
      polled_ids_.push_back(id);
      if (!connection.admitted && !connection.close_after) {
        next_deadline = std::min(next_deadline.value_or(connection.admit_by), connection.admit_by);
      }
    }
    return next_deadline ? milliseconds_until(*next_deadline) : -1;
  }

  // Takes every waiting connection, refusing those over the bound; rests
  // the listener when the process is out of descriptors.
  void accept_connections() {
    for (;;) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE) {
          accept_paused_until_ = Clock::now() + kStoreAcceptPause;
          if (is_power_of_two(++accept_failures_)) {
            log_line(port_, fmt::format("cannot accept a connection ({}; {} times so far): resting {} ms",
                                        std::strerror(errno), accept_failures_, kStoreAcceptPause.count()));
          }
        }
        return;  // EAGAIN: none left (other errors: the client gave up; it retries)
      }
      Socket socket(fd);
      if (static_cast<int64_t>(connections_.size()) >= limits_.max_connections) {
        const std::string message = fmt::format(
            "TcpStoreServer: {} connections are open, the bound (max_connections); this one is refused",
            connections_.size());
        refuse_connection(std::move(socket), message);
        if (is_power_of_two(++stats_.connections_refused)) {
          log_line(port_, fmt::format("{} ({} refused so far)", message, stats_.connections_refused));
        }
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      connections_.emplace(next_id_++, Connection{.socket = std::move(socket),
                                                  .admitted = !state_.has_secret(),
                                                  .admit_by = Clock::now() + limits_.admission_timeout});
      ++stats_.connections_accepted;
    }
  }

  // Reads what the polled connections have, each up to its bound; drops
  // those that closed.
  void read_ready(const std::vector<pollfd>& polled) {
    for (size_t index = 2; index < polled.size(); ++index) {
      const uint64_t id = polled_ids_[index - 2];
      Connection& connection = connections_.at(id);
      if ((polled[index].revents & (POLLIN | POLLHUP | POLLERR)) == 0 || connection.close_after) continue;
      if (!read_available(connection, state_.input_bound(connection))) {
        drop(id);
        continue;
      }
      stats_.largest_input_bytes = std::max<uint64_t>(stats_.largest_input_bytes, connection.input.size());
    }
  }

  // Handles requests, releases the gets they answer and sends the replies,
  // again and again until no connection has a request it can take. The
  // stats go out before the replies: a client that has its reply sees its
  // request counted.
  void answer_requests() {
    for (bool progressed = true; progressed;) {
      progressed = false;
      for (auto& [id, connection] : connections_) progressed = state_.handle_input(id, connection) || progressed;
      state_.release_waiters(connections_);
      publish();
      for (auto& [id, connection] : connections_) {
        if (!connection.close_after && !write_pending(connection)) connection.close_after = true;
      }
    }
  }

  // Refuses a connection whose input is full and cannot be handled (a flood
  // behind a parked get), and one not admitted in time.
  void cut_off_stalled() {
    const Clock::time_point now = Clock::now();
    for (auto& [id, connection] : connections_) {
      if (connection.close_after) continue;
      if (connection.input_full) {
        if (connection.input.size() >= state_.input_bound(connection)) {
          const std::string message = fmt::format(
              "TcpStoreServer: more than {} bytes wait on a connection, the bound a connection may buffer "
              "(max_input_bytes: its largest request); it is closed",
              state_.input_bound(connection));
          log_line(port_, message);
          refuse(connection, message);
          state_.forget(id);
        }
        connection.input_full = false;  // it took some: read again
      } else if (!connection.admitted && now >= connection.admit_by) {
        refuse(connection, fmt::format("TcpStoreServer: the job secret did not come within {} ms of connecting",
                                       limits_.admission_timeout.count()));
      }
    }
  }

  // Sends what the sockets take; closes the connections that failed and the
  // refused ones whose refusal has gone out.
  void flush_and_close() {
    std::vector<uint64_t> finished;
    for (auto& [id, connection] : connections_) {
      const bool alive = write_pending(connection);
      if (!alive || (connection.close_after && connection.output.empty())) finished.push_back(id);
    }
    for (const uint64_t id : finished) drop(id);
    publish();
  }

 private:
  void drop(uint64_t id) {
    state_.forget(id);
    connections_.erase(id);
  }

  void publish() {
    stats_.connections_open = static_cast<int64_t>(connections_.size());
    stats_.parked_gets = state_.parked_gets();
    stats_.held_bytes = state_.held_bytes();
    publish_(stats_);
  }

  int listener_;
  int port_;
  StoreLimits limits_;
  StoreState state_;
  std::function<void(const Stats&)> publish_;
  std::map<uint64_t, Connection> connections_;
  std::vector<uint64_t> polled_ids_;  // the connection of each polled entry after the first two
  uint64_t next_id_ = 0;
  Stats stats_;
  int64_t accept_failures_ = 0;
  Clock::time_point accept_paused_until_{};
};

}  // namespace

int default_store_connection_bound() {
  rlimit descriptors{};
  if (::getrlimit(RLIMIT_NOFILE, &descriptors) != 0 || descriptors.rlim_cur == RLIM_INFINITY) return 65536;
  return static_cast<int>(std::clamp<rlim_t>(descriptors.rlim_cur / 2, 16, 65536));
}

TcpStoreServer::TcpStoreServer(const std::string& address, int port, std::optional<std::string> secret,
                               StoreLimits limits)
    : listener_(listen_tcp(address, port)), port_(bound_port(listener_)), secret_(std::move(secret)), limits_(limits) {
  const std::string where = address.empty() ? fmt::format("port {} of every interface", port_)
                                            : endpoint_name(address, port_);
  TESSERA_CHECK(secret_ || is_bound_to_loopback(listener_),
                "TcpStoreServer: a store on {} is reachable from other hosts, so it needs a job secret ({}) to admit "
                "only its job's processes; without one it serves on loopback only",
                where, kJobSecretVariable);
  TESSERA_CHECK(!secret_ || (secret_->size() >= kShortestJobSecret && secret_->size() <= kLongestJobSecret),
                "TcpStoreServer: a job secret holds {} to {} characters, this one {}", kShortestJobSecret,
                kLongestJobSecret, secret_ ? secret_->size() : 0);
  TESSERA_CHECK(limits_.max_key_bytes >= 1 && limits_.max_value_bytes >= 1 && limits_.max_total_bytes >= 1 &&
                    limits_.max_connections >= 1 && limits_.admission_timeout.count() > 0,
                "TcpStoreServer: every bound must be positive (max_key_bytes {}, max_value_bytes {}, max_total_bytes "
                "{}, max_connections {}, admission_timeout {} ms)",
                limits_.max_key_bytes, limits_.max_value_bytes, limits_.max_total_bytes, limits_.max_connections,
                limits_.admission_timeout.count());
  int pipe_ends[2];
  if (::pipe2(pipe_ends, O_CLOEXEC | O_NONBLOCK) != 0) fail("TcpStoreServer: pipe failed: {}", std::strerror(errno));
  wake_read_ = pipe_ends[0];
  wake_write_ = pipe_ends[1];
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char stop = 1;
  while (::write(wake_write_, &stop, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(wake_read_);
  ::close(wake_write_);
}

TcpStoreServer::Stats TcpStoreServer::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void TcpStoreServer::publish(const Stats& stats) {
  std::lock_guard lock(stats_mutex_);
  stats_ = stats;
}

void TcpStoreServer::serve() {
  StoreService service(listener_.fd(), port_, secret_, limits_, [this](const Stats& stats) { publish(stats); });
  std::vector<pollfd> polled;
  for (;;) {
    const int wait_milliseconds = service.poll_list(wake_read_, polled);
    if (::poll(polled.data(), polled.size(), wait_milliseconds) < 0) {
      if (errno == EINTR) continue;
      log_line(port_, fmt::format("poll failed ({}); the store stops", std::strerror(errno)));
      return;
    }
    if (polled[0].revents != 0) return;  // the destructor's wake-up
    if (polled[1].revents & POLLIN) service.accept_connections();
    service.read_ready(polled);
    service.answer_requests();
    service.cut_off_stalled();
    service.flush_and_close();
  }
}

}  // namespace tessera::dist
