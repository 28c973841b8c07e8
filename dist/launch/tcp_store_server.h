// dist::TcpStoreServer: the key-value server behind a launch's rendezvous
// (dist/launch/tcp_store.h), hosted by one rank (rank 0 of a torchrun-style launch)
// on a thread of its own. It keeps keys and values in memory, answers each
// connection's requests in order, and parks a get until its key is set, so
// a rank can ask before another has published. One thread polls every
// connection; no request blocks another.
#pragma once

#include <atomic>
#include <thread>

#include "dist/launch/tcp_socket.h"

namespace tessera::dist {

class TcpStoreServer {
 public:
  // Listens on `port` on every interface (0: a port the system picks, see
  // port()). A port in use is an Error naming it.
  explicit TcpStoreServer(int port);
  // Stops serving and closes every connection: clients waiting in a get see
  // the connection close.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Connections accepted so far (tests).
  int64_t connections_accepted() const { return accepted_.load(); }

 private:
  void serve();

  Socket listener_;
  int port_ = 0;
  int wake_read_ = -1, wake_write_ = -1;  // a pipe that ends serve()
  std::atomic<int64_t> accepted_{0};
  std::thread thread_;
};

}  // namespace tessera::dist
