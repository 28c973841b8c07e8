// TcpStoreServer (contract in tcp_store_server.h). One poll() loop over the
// listening socket, a wake pipe and every connection. Each connection has an
// input buffer (requests may arrive in pieces) and an output buffer (replies
// go out as the socket takes them), so a slow or stalled client never blocks
// the others. A get of a missing key parks the connection in `waiters`
// until a set or add creates the key.
#include "dist/launch/tcp_store_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "dist/launch/store_protocol.h"

namespace tessera::dist {
namespace {

namespace protocol = store_protocol;
using Bytes = std::vector<std::byte>;

struct Connection {
  Socket socket;
  Bytes input{};
  Bytes output{};
  size_t output_sent = 0;
  bool parked = false;        // waiting in a get: later requests wait behind it
  bool close_after = false;   // a refused request: flush the refusal, then close
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

// The whole server state, owned by the serving thread.
class StoreState {
 public:
  // Handles the complete requests at the front of `connection.input`.
  void handle_input(uint64_t id, Connection& connection) {
    size_t consumed = 0;
    while (!connection.parked && !connection.close_after) {
      const std::span<const std::byte> rest = std::span(connection.input).subspan(consumed);
      if (rest.size() < protocol::kRequestHeaderBytes) break;
      const protocol::RequestHeader header =
          protocol::decode_request(rest.first<protocol::kRequestHeaderBytes>());
      if (header.key_bytes == 0 || header.key_bytes > protocol::kMaxKeyBytes ||
          header.value_bytes > protocol::kMaxValueBytes) {
        refuse(connection, "TcpStoreServer: a request with a key of " + std::to_string(header.key_bytes) +
                               " bytes and a value of " + std::to_string(header.value_bytes) +
                               " bytes is outside the store's bounds");
        break;
      }
      const size_t total = protocol::kRequestHeaderBytes + header.key_bytes + header.value_bytes;
      if (rest.size() < total) break;
      const auto* key_begin = reinterpret_cast<const char*>(rest.data() + protocol::kRequestHeaderBytes);
      std::string key(key_begin, header.key_bytes);
      const std::span<const std::byte> value = rest.subspan(protocol::kRequestHeaderBytes + header.key_bytes,
                                                            header.value_bytes);
      consumed += total;
      handle(id, connection, header.op, std::move(key), value);
    }
    connection.input.erase(connection.input.begin(), connection.input.begin() + static_cast<ptrdiff_t>(consumed));
  }

  // Replies to the connections parked on `key` (now set); returns their ids,
  // whose next requests may now be handled.
  std::vector<uint64_t> release_waiters(const std::string& key, std::map<uint64_t, Connection>& connections) {
    std::vector<uint64_t> released;
    const auto waiting = waiters_.find(key);
    if (waiting == waiters_.end()) return released;
    for (const uint64_t id : waiting->second) {
      const auto connection = connections.find(id);
      if (connection == connections.end()) continue;
      reply(connection->second, protocol::Status::ok, values_.at(key));
      connection->second.parked = false;
      released.push_back(id);
    }
    waiters_.erase(waiting);
    return released;
  }

  void forget(uint64_t id) {
    for (auto& [key, ids] : waiters_) std::erase(ids, id);
  }

  // The keys sets and adds wrote since the last call (to release their waiters).
  std::vector<std::string> take_changed_keys() { return std::exchange(changed_keys_, {}); }

 private:
  void handle(uint64_t id, Connection& connection, protocol::Op op, std::string key, std::span<const std::byte> value) {
    switch (op) {
      case protocol::Op::set:
        values_[key] = Bytes(value.begin(), value.end());
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
        if (value.size() != 8) {
          refuse(connection, "TcpStoreServer: add('" + key + "') needs an 8-byte delta");
          return;
        }
        Bytes& stored = values_[key];
        if (!stored.empty() && stored.size() != 8) {
          refuse(connection, "TcpStoreServer: add('" + key + "'): the key holds " + std::to_string(stored.size()) +
                                 " bytes set by set(), not a counter");
          return;
        }
        const uint64_t old_value = stored.empty() ? 0 : protocol::get_le(stored.data(), 8);
        const uint64_t new_value = old_value + protocol::get_le(value.data(), 8);  // two's complement i64
        stored.resize(8);
        protocol::put_le(stored.data(), new_value, 8);
        changed_keys_.push_back(key);
        reply(connection, protocol::Status::ok, stored);
        return;
      }
      case protocol::Op::check: {
        const std::byte present{values_.contains(key) ? uint8_t{1} : uint8_t{0}};
        reply(connection, protocol::Status::ok, std::span(&present, 1));
        return;
      }
    }
    refuse(connection, "TcpStoreServer: unknown request op " + std::to_string(static_cast<int>(op)));
  }

  std::map<std::string, Bytes> values_;
  std::map<std::string, std::vector<uint64_t>> waiters_;
  std::vector<std::string> changed_keys_;
};

// Reads what the connection has; false when it closed or failed.
bool read_available(Connection& connection) {
  std::byte buffer[64 * 1024];
  for (;;) {
    const ssize_t count = ::recv(connection.socket.fd(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (count > 0) {
      append(connection.input, std::span(buffer, static_cast<size_t>(count)));
      continue;
    }
    if (count == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
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

}  // namespace

TcpStoreServer::TcpStoreServer(int port) : listener_(listen_tcp(kEveryInterface, port)), port_(bound_port(listener_)) {
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

void TcpStoreServer::serve() {
  StoreState state;
  std::map<uint64_t, Connection> connections;
  uint64_t next_id = 0;
  std::vector<pollfd> polled;
  std::vector<uint64_t> polled_ids;
  for (;;) {
    polled.assign({pollfd{.fd = wake_read_, .events = POLLIN, .revents = 0},
                   pollfd{.fd = listener_.fd(), .events = POLLIN, .revents = 0}});
    polled_ids.clear();
    for (auto& [id, connection] : connections) {
      const short events = static_cast<short>(POLLIN | (connection.output.empty() ? 0 : POLLOUT));
      polled.push_back({.fd = connection.socket.fd(), .events = events, .revents = 0});
      polled_ids.push_back(id);
    }
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "tessera TcpStoreServer on port %d: poll failed (%s); the store stops\n", port_,
                   std::strerror(errno));
      return;
    }
    if (polled[0].revents != 0) return;  // the destructor's wake-up
    if (polled[1].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;  // EAGAIN: none left (other errors: the client gave up; it retries)
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        connections.emplace(next_id++, Connection{.socket = Socket(fd)});
        accepted_.fetch_add(1);
      }
    }
    std::vector<uint64_t> to_handle;
    std::vector<uint64_t> closed;
    for (size_t index = 2; index < polled.size(); ++index) {
      const uint64_t id = polled_ids[index - 2];
      Connection& connection = connections.at(id);
      const short events = polled[index].revents;
      if (events & (POLLIN | POLLHUP | POLLERR)) {
        if (!read_available(connection)) {
          closed.push_back(id);
          continue;
        }
        to_handle.push_back(id);
      }
    }
    for (const uint64_t id : closed) {
      state.forget(id);
      connections.erase(id);
    }
    // Handling a set can release parked connections, whose queued requests
    // are handled in turn.
    while (!to_handle.empty()) {
      const uint64_t id = to_handle.back();
      to_handle.pop_back();
      const auto connection = connections.find(id);
      if (connection == connections.end()) continue;
      state.handle_input(id, connection->second);
      for (const std::string& key : state.take_changed_keys()) {
        for (const uint64_t released : state.release_waiters(key, connections)) to_handle.push_back(released);
      }
    }
    for (auto connection = connections.begin(); connection != connections.end();) {
      const bool alive = write_pending(connection->second);
      const bool done = connection->second.close_after && connection->second.output.empty();
      if (!alive || done) {
        state.forget(connection->first);
        connection = connections.erase(connection);
      } else {
        ++connection;
      }
    }
  }
}

}  // namespace tessera::dist
