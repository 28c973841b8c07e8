// TcpStore (contract in tcp_store.h): one connection, one request at a time
// (store_protocol.h), each bounded by the store's timeout.
#include "dist/launch/tcp_store.h"

#include <charconv>
#include <cstdio>
#include <utility>

#include "dist/launch/job_secret.h"
#include "dist/launch/store_protocol.h"

namespace tessera::dist {
namespace {

namespace protocol = store_protocol;

constexpr const char* kLoopback = "127.0.0.1";

double seconds(std::chrono::milliseconds duration) { return std::chrono::duration<double>(duration).count(); }

void check_key(const std::string& key, const char* op) {
  TESSERA_CHECK(!key.empty(), "TcpStore::{}: the key is empty", op);
  TESSERA_CHECK(key.size() <= protocol::kMaxKeyBytes, "TcpStore::{}: the key '{}...' has {} bytes, above the {} a key may have", op,
                key.substr(0, 32), key.size(), protocol::kMaxKeyBytes);
}

int parse_port(const std::string& text) {
  int port = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, port);
  if (text.empty() || error != std::errc() || stop != end || port < 1 || port > 65535) {
    fail("dist::connect_launch_store: MASTER_PORT='{}' is not a port in [1, 65535]", text);
  }
  return port;
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, std::chrono::milliseconds timeout, std::optional<std::string> secret)
    : host_(std::move(host)),
      port_(port),
      endpoint_(endpoint_name(host_, port)),
      timeout_(timeout),
      secret_(std::move(secret)) {
  TESSERA_CHECK(timeout.count() > 0, "TcpStore: the timeout must be positive, got {} ms", timeout.count());
  std::lock_guard lock(mutex_);
  connect(Clock::now() + timeout_);
}

void TcpStore::connect(Clock::time_point deadline) {
  socket_ = connect_tcp(host_, port_, deadline);
  if (!secret_) return;
  try {
    exchange(static_cast<uint8_t>(protocol::Op::authenticate), *secret_, {}, "TcpStore: authenticate at " + endpoint_,
             deadline);
  } catch (const Error&) {
    socket_ = Socket();
    throw;
  }
}

std::vector<std::byte> TcpStore::exchange(uint8_t op, const std::string& key, std::span<const std::byte> value,
                                          const std::string& where, Clock::time_point deadline) {
  // One send: a request in one piece is one packet, and a server that
  // refuses it from its header cannot close before the rest is on its way.
  const auto header = protocol::encode({static_cast<protocol::Op>(op), static_cast<uint32_t>(key.size()),
                                        static_cast<uint64_t>(value.size())});
  std::vector<std::byte> request(header.begin(), header.end());
  const auto key_bytes = std::as_bytes(std::span(key));
  request.insert(request.end(), key_bytes.begin(), key_bytes.end());
  request.insert(request.end(), value.begin(), value.end());
  try {
    send_all(socket_, request, deadline, where);
  } catch (const StoreTimeout&) {
    throw;
  } catch (const Error&) {
    // A long request the server refused from its header: the refusal came
    // before the close that failed the rest.
    if (const std::optional<std::string> refusal = refusal_waiting(deadline)) fail("{}: refused: {}", where, *refusal);
    throw;
  }
  std::array<std::byte, protocol::kReplyHeaderBytes> reply_header{};
  receive_all(socket_, reply_header, deadline, where);
  const uint64_t payload_bytes = protocol::get_le(reply_header.data() + 1, 8);
  TESSERA_CHECK(payload_bytes <= protocol::kMaxValueBytes,
                "{}: the server announced a reply of {} bytes, above the {} a value may have", where, payload_bytes,
                protocol::kMaxValueBytes);
  std::vector<std::byte> payload(payload_bytes);
  receive_all(socket_, payload, deadline, where);
  if (static_cast<protocol::Status>(reply_header[0]) != protocol::Status::ok) {
    fail("{}: refused: {}", where, std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
  }
  return payload;
}

std::optional<std::string> TcpStore::refusal_waiting(Clock::time_point deadline) {
  try {
    std::array<std::byte, protocol::kReplyHeaderBytes> header{};
    receive_all(socket_, header, deadline, endpoint_);
    const uint64_t length = protocol::get_le(header.data() + 1, 8);
    if (static_cast<protocol::Status>(header[0]) != protocol::Status::refused || length > protocol::kMaxValueBytes) {
      return std::nullopt;
    }
    std::string message(length, '\0');
    receive_all(socket_, std::as_writable_bytes(std::span(message)), deadline, endpoint_);
    return message;
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::vector<std::byte> TcpStore::request(uint8_t op, const std::string& key, std::span<const std::byte> value,
                                         const std::string& what, Clock::time_point deadline) {
  const std::string where = "TcpStore: " + what + " at " + endpoint_;
  std::lock_guard lock(mutex_);
  if (!socket_.valid()) connect(deadline);
  try {
    return exchange(op, key, value, where, deadline);
  } catch (const StoreTimeout&) {
    socket_ = Socket();  // a reply may still come: start over on a new connection
    throw StoreTimeout(fmt::format("{}: timed out after {:.1f} s", where, seconds(timeout_)));
  } catch (const Error&) {
    socket_ = Socket();  // the server closes a connection it refused
    throw;
  }
}

void TcpStore::set(const std::string& key, std::span<const std::byte> value) {
  check_key(key, "set");
  TESSERA_CHECK(value.size() <= protocol::kMaxValueBytes, "TcpStore::set('{}'): a value of {} bytes is above the {} a value may have",
                key, value.size(), protocol::kMaxValueBytes);
  request(static_cast<uint8_t>(protocol::Op::set), key, value, "set('" + key + "')", Clock::now() + timeout_);
}

void TcpStore::set(const std::string& key, const std::string& value) { set(key, std::as_bytes(std::span(value))); }

std::vector<std::byte> TcpStore::get(const std::string& key) { return get_until(key, Clock::now() + timeout_); }

std::vector<std::byte> TcpStore::get_until(const std::string& key, Clock::time_point deadline) {
  check_key(key, "get");
  try {
    return request(static_cast<uint8_t>(protocol::Op::get), key, {}, "get('" + key + "')", deadline);
  } catch (const StoreTimeout& timeout) {
    throw StoreTimeout(std::string(timeout.what()) + " waiting for a rank to set the key");
  }
}

std::string TcpStore::get_string(const std::string& key) {
  const std::vector<std::byte> value = get(key);
  return {reinterpret_cast<const char*>(value.data()), value.size()};
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_key(key, "add");
  std::array<std::byte, 8> encoded{};
  protocol::put_le(encoded.data(), static_cast<uint64_t>(delta), 8);
  const std::vector<std::byte> sum =
      request(static_cast<uint8_t>(protocol::Op::add), key, encoded, "add('" + key + "')", Clock::now() + timeout_);
  TESSERA_CHECK(sum.size() == 8, "TcpStore: add('{}') at {}: a reply of {} bytes, not 8", key, endpoint_, sum.size());
  return static_cast<int64_t>(protocol::get_le(sum.data(), 8));
}

bool TcpStore::check(const std::string& key) {
  check_key(key, "check");
  const std::vector<std::byte> present =
      request(static_cast<uint8_t>(protocol::Op::check), key, {}, "check('" + key + "')", Clock::now() + timeout_);
  TESSERA_CHECK(present.size() == 1, "TcpStore: check('{}') at {}: a reply of {} bytes, not 1", key, endpoint_,
                present.size());
  return present[0] != std::byte{0};
}

// Each rank sets its own key, then waits for every rank's: a timeout can
// then say which ranks never came.
void TcpStore::barrier(const std::string& name, int rank, int world_size) {
  TESSERA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
                "TcpStore::barrier('{}'): rank {} is outside [0, {})", name, rank, world_size);
  const auto key_of = [&](int r) { return "barrier/" + name + "/" + std::to_string(r); };
  set(key_of(rank), std::string("1"));
  const Clock::time_point deadline = Clock::now() + timeout_;
  for (int other = 0; other < world_size; ++other) {
    try {
      get_until(key_of(other), deadline);
    } catch (const StoreTimeout&) {
      std::string missing;
      for (int r = 0; r < world_size; ++r) {
        if (!check(key_of(r))) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw StoreTimeout(fmt::format("TcpStore::barrier('{}') at {}: timed out after {:.1f} s on rank {} of {}; "
                                     "ranks that did not arrive: {}",
                                     name, endpoint_, seconds(timeout_), rank, world_size,
                                     missing.empty() ? std::string("none (they arrived late)") : missing));
    }
  }
}

LaunchStore connect_launch_store(const LaunchInfo& launch, std::chrono::milliseconds timeout,
                                 const EnvironmentLookup& environment) {
  const std::optional<std::string> host = environment("MASTER_ADDR");
  const std::optional<std::string> port_text = environment("MASTER_PORT");
  TESSERA_CHECK(host && !host->empty(), "dist::connect_launch_store: MASTER_ADDR is not set; a torchrun-style launch "
                "names the host of rank 0 in it");
  TESSERA_CHECK(port_text.has_value(), "dist::connect_launch_store: MASTER_PORT is not set; a torchrun-style launch "
                "names rank 0's store port in it");
  const int port = parse_port(*port_text);
  std::optional<std::string> secret = job_secret_from(environment);
  LaunchStore result;
  if (launch.world_size == 1) {
    // A world of one meets only itself.
    if (!secret) secret = new_job_secret();
    result.server = std::make_unique<TcpStoreServer>(kLoopback, port, secret);
    result.store = std::make_shared<TcpStore>(kLoopback, port, timeout, secret);
    return result;
  }
  const bool this_host_alone = is_loopback_host(*host);
  TESSERA_CHECK(secret || this_host_alone,
                "dist::connect_launch_store: MASTER_ADDR={} is reached from other hosts, so the rendezvous store "
                "admits only the job's processes, by a secret they share; set {} to the same value for every rank "
                "(for example `export {}=$(openssl rand -hex 16)` where the ranks are started; "
                "docs/distributed.md#security-model)",
                *host, kJobSecretVariable, kJobSecretVariable);
  if (launch.rank == 0) {
    if (!secret) {
      std::fprintf(stderr,
                   "tessera: %s is not set: the rendezvous store at %s admits any process of this host (set it for "
                   "every rank to admit only the job's; docs/distributed.md#security-model)\n",
                   kJobSecretVariable, endpoint_name(*host, port).c_str());
    }
    result.server = std::make_unique<TcpStoreServer>(this_host_alone ? *host : kEveryInterface, port, secret);
  }
  result.store = std::make_shared<TcpStore>(*host, port, timeout, secret);
  return result;
}

void LaunchStore::leave(int rank, int world_size) {
  if (rank != 0) {
    store->set(fmt::format("left/{}", rank), std::string("1"));
  } else {
    for (int other = 1; other < world_size; ++other) store->get(fmt::format("left/{}", other));
  }
  store.reset();
  server.reset();
}

LaunchStore connect_store_through(ProcessGroup& group, std::chrono::milliseconds timeout,
                                  const EnvironmentLookup& environment) {
  LaunchStore result;
  std::string handed_out;  // rank 0's "secret\nhost:port"
  if (group.rank() == 0) {
    const std::optional<std::string> port = environment("MASTER_PORT");
    std::optional<std::string> host = environment("MASTER_ADDR");
    if (group.size() == 1) {
      host = kLoopback;
    } else if (!host || host->empty()) {
      host = host_name();
    }
    const std::string secret = job_secret_from(environment).value_or(new_job_secret());
    result.server = std::make_unique<TcpStoreServer>(is_loopback_host(*host) ? *host : kEveryInterface,
                                                     port ? parse_port(*port) : 0, secret);
    handed_out = fmt::format("{}\n{}:{}", secret, *host, result.server->port());
  }
  const auto gathered = group.all_gather_bytes(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(handed_out.data()), handed_out.size()));
  const std::string served(gathered[0].begin(), gathered[0].end());
  const size_t newline = served.find('\n');
  const size_t colon = served.rfind(':');
  TESSERA_CHECK(newline != std::string::npos && colon != std::string::npos && colon > newline,
                "dist::connect_store_through: rank 0 handed out a malformed store address");
  result.store = std::make_shared<TcpStore>(served.substr(newline + 1, colon - newline - 1),
                                            std::stoi(served.substr(colon + 1)), timeout, served.substr(0, newline));
  return result;
}

}  // namespace tessera::dist
