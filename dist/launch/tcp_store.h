// dist::TcpStore: a client of the key-value store a job's ranks meet at
// before they can talk to each other (a TcpStoreServer, hosted by one of
// them). It is how a torchrun-style launch (MASTER_ADDR, MASTER_PORT) hands
// rank 0's NCCL unique id to every rank, and a barrier no collective backend
// is needed for. As torch.distributed's TCPStore: set and get bytes by key
// (get waits until some rank sets the key), add to a counter, check for keys.
//
// Every operation, and the connect, ends by the store's timeout: a rank
// that never arrives is a StoreTimeout naming the key, the server and what
// was missing, never a hang. A server that goes away is an Error saying so.
// Calls from several threads are serialised (one connection, in order).
//
// Who may use the store: a server with a job secret (TESSERA_JOB_SECRET)
// admits only clients that present it; one without serves on loopback only
// (tcp_store_server.h). The launch helpers below decide (the security model
// in docs/distributed.md):
//   - a world of one serves on loopback with a secret of its own;
//   - MASTER_ADDR on loopback (every rank on this host) serves there, with
//     TESSERA_JOB_SECRET when set, else without one and a warning;
//   - any other MASTER_ADDR serves on every interface and needs
//     TESSERA_JOB_SECRET on every rank: without it each rank refuses to
//     start, naming the variable (tools/launch sets it; under a
//     torchrun-style launch whoever starts the ranks does);
//   - a group that can already talk (MPI) hands rank 0's secret
//     (TESSERA_JOB_SECRET, else a new one) to its ranks with the address.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/launch/launch_environment.h"
#include "dist/launch/tcp_socket.h"
#include "dist/launch/tcp_store_server.h"
#include "dist/process_group.h"

namespace tessera::dist {

class TcpStore {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start
  // later), which also bounds every operation after; presents `secret` first
  // on every connection when given (a server that refuses it is an Error).
  TcpStore(std::string host, int port, std::chrono::milliseconds timeout,
           std::optional<std::string> secret = std::nullopt);

  void set(const std::string& key, std::span<const std::byte> value);
  void set(const std::string& key, const std::string& value);
  // The key's value, waiting until a rank sets it (StoreTimeout after the timeout).
  std::vector<std::byte> get(const std::string& key);
  std::string get_string(const std::string& key);
  // Adds delta to the key's i64 counter (0 if absent) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // Whether the key is set, without waiting.
  bool check(const std::string& key);

  // Returns once every rank of [0, world_size) has called it with this name;
  // on timeout the StoreTimeout lists the ranks that had not.
  void barrier(const std::string& name, int rank, int world_size);

  const std::string& endpoint() const { return endpoint_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::vector<std::byte> request(uint8_t op, const std::string& key, std::span<const std::byte> value,
                                 const std::string& what, Clock::time_point deadline);
  // One request and its reply on the open connection (the caller holds the lock).
  std::vector<std::byte> exchange(uint8_t op, const std::string& key, std::span<const std::byte> value,
                                  const std::string& where, Clock::time_point deadline);
  // The refusal the server sent before closing the connection, if one waits.
  std::optional<std::string> refusal_waiting(Clock::time_point deadline);
  std::vector<std::byte> get_until(const std::string& key, Clock::time_point deadline);
  void connect(Clock::time_point deadline);

  std::string host_;
  int port_;
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::optional<std::string> secret_;
  std::mutex mutex_;
  Socket socket_;  // invalid after a failed request: the next one reconnects
};

// The store of a torchrun-style launch: MASTER_ADDR and MASTER_PORT name it,
// rank 0 serves it at MASTER_PORT (where: see above) and every rank, rank 0
// too, connects. Keep `server` alive until the ranks are done with the
// store (they are after the rendezvous they use it for).
struct LaunchStore {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
  std::shared_ptr<TcpStore> store;

  // The ranks are done with the store: each other rank says so as its last
  // operation, and rank 0, which serves it, stops serving once all have
  // (a server that went first would break a rank's last get).
  void leave(int rank, int world_size);
};
// Missing or malformed variables, and a store other hosts reach without
// TESSERA_JOB_SECRET, are an Error naming them.
LaunchStore connect_launch_store(const LaunchInfo& launch, std::chrono::milliseconds timeout,
                                 const EnvironmentLookup& environment = process_environment);

// A store for the ranks of a group that can already talk (the MPI world
// under mpirun or srun, which sets no MASTER_ADDR): its rank 0 serves the
// store, at MASTER_PORT when set, else at a port the system picks, and the
// group hands the address (MASTER_ADDR when set, else rank 0's host name;
// 127.0.0.1 for a group of one) and the secret to every rank. Collective
// over the group.
LaunchStore connect_store_through(ProcessGroup& group, std::chrono::milliseconds timeout,
                                  const EnvironmentLookup& environment = process_environment);

}  // namespace tessera::dist
