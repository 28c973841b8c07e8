// TCP sockets with deadlines (contract in tcp_socket.h). POSIX sockets and
// poll(): every wait is bounded by the caller's deadline.
#include "dist/launch/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <vector>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace tessera::dist {
namespace {

std::string system_reason(int error) { return std::strerror(error); }

double seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// Milliseconds poll() may wait before `deadline` (0 once it has passed).
int poll_milliseconds(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// Waits until `socket` is ready for `events` or `deadline` passes (false).
bool wait_ready(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd entry{.fd = fd, .events = events, .revents = 0};
    const int ready = ::poll(&entry, 1, poll_milliseconds(deadline));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) fail("{}: poll failed: {}", what, system_reason(errno));
    if (ready == 0 && Clock::now() >= deadline) return false;
  }
}

void set_option(int fd, int level, int option, int value, const char* name) {
  if (::setsockopt(fd, level, option, &value, sizeof value) != 0) {
    fail("dist::tcp: setsockopt({}) failed: {}", name, system_reason(errno));
  }
}

// Errors worth another connect attempt: the server is not listening yet, or
// its network is not up yet.
bool retry_connect(int error) {
  return error == ECONNREFUSED || error == ETIMEDOUT || error == ENETUNREACH || error == EHOSTUNREACH ||
         error == ECONNRESET || error == EAGAIN || error == EINPROGRESS;
}

// One connect attempt to one address, bounded by `deadline`: the connected
// socket, or an invalid one with `error` set.
Socket try_connect(const addrinfo& address, Clock::time_point deadline, int& error) {
  Socket socket(::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC, address.ai_protocol));
  if (!socket.valid()) {
    error = errno;
    return {};
  }
  const int flags = ::fcntl(socket.fd(), F_GETFL);
  ::fcntl(socket.fd(), F_SETFL, flags | O_NONBLOCK);
  if (::connect(socket.fd(), address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      error = errno;
      return {};
    }
    pollfd entry{.fd = socket.fd(), .events = POLLOUT, .revents = 0};
    if (::poll(&entry, 1, poll_milliseconds(deadline)) <= 0) {
      error = ETIMEDOUT;
      return {};
    }
    socklen_t length = sizeof error;
    ::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) return {};
  }
  ::fcntl(socket.fd(), F_SETFL, flags);
  set_option(socket.fd(), IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
  error = 0;
  return socket;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

int Socket::release() { return std::exchange(fd_, -1); }

std::string endpoint_name(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

// Binds and listens on one resolved address; an invalid socket, with
// `error` set, where that address cannot be bound.
Socket listen_on(const addrinfo& address, int& error) {
  Socket socket(::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, address.ai_protocol));
  if (!socket.valid()) {
    error = errno;
    return {};
  }
  set_option(socket.fd(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR");
  // One wildcard IPv6 socket serves IPv4 too; a named IPv6 address only itself.
  if (address.ai_family == AF_INET6) set_option(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, 0, "IPV6_V6ONLY");
  if (::bind(socket.fd(), address.ai_addr, address.ai_addrlen) != 0 || ::listen(socket.fd(), SOMAXCONN) != 0) {
    error = errno;
    return {};
  }
  return socket;
}

}  // namespace

Socket listen_tcp(const std::string& address, int port) {
  TESSERA_CHECK(port >= 0 && port <= 65535, "dist::tcp: port {} is outside [0, 65535]", port);
  const bool everywhere = address.empty();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int resolved = ::getaddrinfo(everywhere ? nullptr : address.c_str(), service.c_str(), &hints, &found);
  if (resolved != 0) fail("dist::tcp: cannot listen on {}: {}", address, ::gai_strerror(resolved));
  const std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  // Every interface: IPv6 first (it takes IPv4 too), IPv4 where IPv6 is off.
  std::vector<const addrinfo*> candidates;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) candidates.push_back(entry);
  if (everywhere) {
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const addrinfo* entry) { return entry->ai_family == AF_INET6; });
  }
  const std::string where = everywhere ? fmt::format("port {}", port) : endpoint_name(address, port);
  int error = 0;
  for (const addrinfo* candidate : candidates) {
    Socket socket = listen_on(*candidate, error);
    if (socket.valid()) return socket;
    if (error == EADDRINUSE) break;
  }
  fail("dist::tcp: cannot listen on {}: {}", where, system_reason(error));
}

namespace {

sockaddr_storage local_address(const Socket& socket) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    fail("dist::tcp: getsockname failed: {}", system_reason(errno));
  }
  return address;
}

}  // namespace

int bound_port(const Socket& socket) {
  const sockaddr_storage address = local_address(socket);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
}

namespace {

bool is_loopback_ipv4(const in_addr& address) { return (ntohl(address.s_addr) >> 24) == 127; }

bool is_loopback_ipv6(const in6_addr& address) {
  if (IN6_IS_ADDR_LOOPBACK(&address)) return true;
  if (!IN6_IS_ADDR_V4MAPPED(&address)) return false;
  in_addr mapped{};
  std::memcpy(&mapped, address.s6_addr + 12, sizeof mapped);
  return is_loopback_ipv4(mapped);
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr ipv4{};
  if (::inet_pton(AF_INET, host.c_str(), &ipv4) == 1) return is_loopback_ipv4(ipv4);
  in6_addr ipv6{};
  return ::inet_pton(AF_INET6, host.c_str(), &ipv6) == 1 && is_loopback_ipv6(ipv6);
}

bool is_bound_to_loopback(const Socket& socket) {
  const sockaddr_storage address = local_address(socket);
  if (address.ss_family == AF_INET) return is_loopback_ipv4(reinterpret_cast<const sockaddr_in&>(address).sin_addr);
  if (address.ss_family == AF_INET6) return is_loopback_ipv6(reinterpret_cast<const sockaddr_in6&>(address).sin6_addr);
  return false;
}

Socket connect_tcp(const std::string& host, int port, Clock::time_point deadline) {
  TESSERA_CHECK(port > 0 && port <= 65535, "dist::tcp: port {} of {} is outside [1, 65535]", port, host);
  const std::string where = endpoint_name(host, port);
  const Clock::time_point start = Clock::now();
  auto backoff = std::chrono::milliseconds(10);
  int last_error = 0;
  std::string last_reason = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addresses = nullptr;
    const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addresses);
    if (resolved == 0) {
      // Every address in turn (localhost may be ::1 on a host without IPv6,
      // then 127.0.0.1); give up only when none failed in a way worth a retry.
      bool worth_retrying = false;
      for (const addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
        Socket socket = try_connect(*address, deadline, last_error);
        if (socket.valid()) {
          ::freeaddrinfo(addresses);
          return socket;
        }
        last_reason = system_reason(last_error);
        worth_retrying = worth_retrying || retry_connect(last_error);
      }
      ::freeaddrinfo(addresses);
      if (!worth_retrying) fail("dist::tcp: cannot connect to {}: {}", where, last_reason);
    } else if (resolved == EAI_AGAIN) {
      last_reason = ::gai_strerror(resolved);  // a resolver that is not up yet: retried
    } else {
      fail("dist::tcp: cannot resolve host '{}': {}", host, ::gai_strerror(resolved));
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      throw StoreTimeout(fmt::format("dist::tcp: could not connect to {} within {:.1f} s: {}", where,
                                     seconds(now - start), last_reason));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));  // the last try at the deadline
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

void send_all(const Socket& socket, std::span<const std::byte> bytes, Clock::time_point deadline,
              const std::string& what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    if (!wait_ready(socket.fd(), POLLOUT, deadline, what)) {
      throw StoreTimeout(fmt::format("{}: timed out sending", what));
    }
    const ssize_t count = ::send(socket.fd(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (count < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("{}: the connection failed while sending: {}", what, system_reason(errno));
    }
    sent += static_cast<size_t>(count);
  }
}

void receive_all(const Socket& socket, std::span<std::byte> bytes, Clock::time_point deadline,
                 const std::string& what) {
  size_t received = 0;
  while (received < bytes.size()) {
    if (!wait_ready(socket.fd(), POLLIN, deadline, what)) {
      throw StoreTimeout(fmt::format("{}: timed out", what));
    }
    const ssize_t count = ::recv(socket.fd(), bytes.data() + received, bytes.size() - received, 0);
    if (count == 0) fail("{}: the server closed the connection", what);
    if (count < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("{}: the connection failed: {}", what, system_reason(errno));
    }
    received += static_cast<size_t>(count);
  }
}

}  // namespace tessera::dist
