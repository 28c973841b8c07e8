// TCP sockets with deadlines, for the store a launch rendezvous runs on
// (dist/launch/tcp_store.h): a listening socket, a connect that retries until a
// deadline (the server may start after its clients, as ranks start in any
// order), and whole-message sends and receives that end at the deadline.
// Every failure is a tessera::Error naming the peer and the system's reason;
// a deadline that passes is a StoreTimeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "dist/errors.h"

namespace tessera::dist {

using Clock = std::chrono::steady_clock;

// An owned socket descriptor (closed by the destructor; move-only).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();

 private:
  int fd_ = -1;
};

// "host:port" for messages (IPv6 literals in brackets).
std::string endpoint_name(const std::string& host, int port);

// Listens on `address` (a host name or an IPv4 or IPv6 literal: one of this
// host's addresses, "127.0.0.1" for this host alone) at `port`, 0 for one the
// system picks. kEveryInterface listens on all of them (IPv6 with IPv4 mapped
// where the system has it, else IPv4): only for a job whose ranks reach it
// from other hosts by names this host cannot know. Non-blocking.
inline const std::string kEveryInterface;
Socket listen_tcp(const std::string& address, int port);
// The local port a listening socket is bound to.
int bound_port(const Socket& socket);

// Whether `host` is this host's loopback ("localhost", 127.0.0.0/8, ::1): a
// listener there is reached from this host alone.
bool is_loopback_host(const std::string& host);
// Whether a listening socket is bound to a loopback address (not to every
// interface, nor to one that other hosts reach).
bool is_bound_to_loopback(const Socket& socket);

// Connects to host:port, retrying refused and unreachable attempts until
// `deadline` (StoreTimeout then, with the last reason); a host that does
// not resolve fails at once. The socket is blocking, with TCP_NODELAY.
Socket connect_tcp(const std::string& host, int port, Clock::time_point deadline);

// Sends or receives exactly bytes.size() bytes before `deadline`. `what`
// names the operation in errors ("get('x') from 10.0.0.1:29500"). A peer
// that closes the connection is an Error saying so; the deadline passing is
// a StoreTimeout.
void send_all(const Socket& socket, std::span<const std::byte> bytes, Clock::time_point deadline,
              const std::string& what);
void receive_all(const Socket& socket, std::span<std::byte> bytes, Clock::time_point deadline,
                 const std::string& what);

}  // namespace tessera::dist
