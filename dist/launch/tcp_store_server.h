// dist::TcpStoreServer: the key-value server behind a launch's rendezvous
// (dist/launch/tcp_store.h), hosted by one rank (rank 0 of a torchrun-style launch)
// on a thread of its own. It keeps keys and values in memory, answers each
// connection's requests in order, and parks a get until its key is set, so
// a rank can ask before another has published. One thread polls every
// connection; no request blocks another.
//
// Who may talk to it: with a job secret (dist/launch/job_secret.h) only a
// connection that presents it first; anything else is refused and closed
// without effect. Without one it serves whoever connects, so it refuses to
// listen anywhere but on loopback, where only this host's processes reach
// it: a store that other hosts reach always has a secret
// (docs/distributed.md#security-model).
//
// What it will hold: StoreLimits bounds every key, value and connection,
// the bytes waiting on a connection and the bytes held in all. A key or
// value over its bound is refused as the request's header announces it,
// never read; a set or add that would take the total over is refused
// without effect. The refusal names the bound, the connection closes, and
// the others go on.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "dist/launch/store_protocol.h"
#include "dist/launch/tcp_socket.h"

namespace tessera::dist {

// Half the descriptors this process may open (RLIMIT_NOFILE), so that the
// store's connections cannot take those the rank needs for its own links.
int default_store_connection_bound();

struct StoreLimits {
  uint32_t max_key_bytes = store_protocol::kMaxKeyBytes;
  uint64_t max_value_bytes = store_protocol::kMaxValueBytes;
  // Keys and values of every entry together.
  uint64_t max_total_bytes = uint64_t{256} << 20;
  int max_connections = default_store_connection_bound();
  // A connection that has not presented the job secret by then is closed.
  std::chrono::milliseconds admission_timeout = std::chrono::seconds(30);

  // The bytes that may wait unanswered on a connection: its largest request.
  uint64_t max_input_bytes() const {
    return store_protocol::kRequestHeaderBytes + max_key_bytes + max_value_bytes;
  }
};

class TcpStoreServer {
 public:
  // What the server has done, for tests and logs.
  struct Stats {
    int64_t connections_accepted = 0;  // admitted under the connection bound
    int64_t connections_refused = 0;   // over the connection bound
    int64_t connections_open = 0;
    int64_t parked_gets = 0;
    uint64_t held_bytes = 0;           // keys and values, the quantity max_total_bytes bounds
    uint64_t largest_input_bytes = 0;  // the most that ever waited on one connection
  };

  // Listens at address:port (listen_tcp: "127.0.0.1" for this host alone,
  // kEveryInterface for all; port 0: one the system picks, see port()).
  // Without a secret the address must be loopback. A port in use, or a
  // store that would be reachable from other hosts without a secret, is an
  // Error naming it.
  TcpStoreServer(const std::string& address, int port, std::optional<std::string> secret = std::nullopt,
                 StoreLimits limits = {});
  // Stops serving and closes every connection: clients waiting in a get see
  // the connection close.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  bool has_secret() const { return secret_.has_value(); }
  Stats stats() const;

 private:
  void serve();
  void publish(const Stats& stats);

  Socket listener_;
  int port_ = 0;
  std::optional<std::string> secret_;
  StoreLimits limits_;
  int wake_read_ = -1, wake_write_ = -1;  // a pipe that ends serve()
  mutable std::mutex stats_mutex_;
  Stats stats_;
  std::thread thread_;
};

}  // namespace tessera::dist
