// dist::TcpStore and TcpStoreServer: the rendezvous of a torchrun-style
// launch, over real TCP sockets on this machine. Ranks are threads here and,
// in one case, forked processes; strangers are raw sockets that speak the
// protocol without TcpStore's checks. Timeouts are asserted from below (a
// wait lasts at least its timeout) and bounded generously from above, so a
// busy machine does not fail them.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/backends/local_backend.h"
#include "dist/launch/job_secret.h"
#include "dist/launch/launch_command.h"
#include "dist/launch/store_protocol.h"
#include "dist/launch/tcp_store.h"
#include "tests/dist/error_message.h"

using namespace tessera;
using namespace tessera::dist;
using tessera::test::message_of;
using namespace std::chrono_literals;

namespace {

namespace protocol = store_protocol;

const std::string kLoopback = "127.0.0.1";

const std::string kUnauthenticated =
    "TcpStoreServer: this store admits only its job's processes: a connection presents the job secret "
    "(TESSERA_JOB_SECRET) before anything else";
const std::string kWrongSecret =
    "TcpStoreServer: wrong job secret: this store admits only its job's processes (TESSERA_JOB_SECRET must be the "
    "same for every rank)";

double store_seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string address_of(const TcpStoreServer& server) { return "127.0.0.1:" + std::to_string(server.port()); }

std::vector<std::byte> bytes_of(const std::string& text) {
  const auto view = std::as_bytes(std::span(text));
  return {view.begin(), view.end()};
}

// A port that was free a moment ago (the system's pick, then released).
int free_port() {
  TcpStoreServer probe(kLoopback, 0);
  return probe.port();
}

// A request as a stranger sends it: any op, any key, with no checks.
std::vector<std::byte> request_bytes(protocol::Op op, const std::string& key, const std::string& value = "") {
  std::vector<std::byte> bytes;
  const auto header = protocol::encode({op, static_cast<uint32_t>(key.size()), value.size()});
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (const std::string* part : {&key, &value}) {
    const auto view = std::as_bytes(std::span(*part));
    bytes.insert(bytes.end(), view.begin(), view.end());
  }
  return bytes;
}

void send_bytes(const Socket& socket, std::span<const std::byte> bytes) {
  send_all(socket, bytes, Clock::now() + 60s, "raw");
}

struct Reply {
  protocol::Status status;
  std::string payload;
};

Reply receive_reply(const Socket& socket) {
  std::array<std::byte, protocol::kReplyHeaderBytes> header{};
  receive_all(socket, header, Clock::now() + 60s, "raw");
  std::string payload(protocol::get_le(header.data() + 1, 8), '\0');
  receive_all(socket, std::as_writable_bytes(std::span(payload)), Clock::now() + 60s, "raw");
  return {static_cast<protocol::Status>(header[0]), payload};
}

// What reading one more byte meets: the server's close ("raw: the server
// closed the connection"), or "(no error)".
std::string after_reply(const Socket& socket) {
  std::byte extra{};
  return message_of([&] { receive_all(socket, std::span(&extra, 1), Clock::now() + 60s, "raw"); });
}

// The server's stats once `holds` is true of them (its thread publishes
// them as it acts), or after a generous bound, for the checks to report.
TcpStoreServer::Stats stats_when(const TcpStoreServer& server,
                                 const std::function<bool(const TcpStoreServer::Stats&)>& holds) {
  const Clock::time_point give_up = Clock::now() + 60s;
  TcpStoreServer::Stats stats = server.stats();
  while (!holds(stats) && Clock::now() < give_up) {
    std::this_thread::sleep_for(10ms);
    stats = server.stats();
  }
  return stats;
}

// Checks that nothing answers at this host's external address on `port`
// (the store there serves loopback alone).
void check_unreachable_from_outside(int port) {
  const std::optional<std::string> external = first_external_ipv4();
  if (!external) {
    MESSAGE("no IPv4 address other than loopback on this machine: not checked that the store is unreachable there");
    return;
  }
  CAPTURE(*external);
  const std::string message = message_of([&] { connect_tcp(*external, port, Clock::now() + 300ms); });
  CHECK(message.starts_with("dist::tcp: could not connect to " + *external + ":" + std::to_string(port)));
  CHECK(message.ends_with("Connection refused"));
}

using Variables = std::map<std::string, std::string>;

EnvironmentLookup environment_of(Variables variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

}  // namespace

TEST_CASE("TcpStore: set, get, add and check between ranks on threads; get waits for the set") {
  TcpStoreServer server(kLoopback, 0);
  REQUIRE(server.port() > 0);
  constexpr int kRanks = 4;
  std::vector<std::string> seen(kRanks);
  std::vector<int64_t> tickets(kRanks);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      TcpStore store("127.0.0.1", server.port(), 30s);
      if (rank == 0) {
        std::this_thread::sleep_for(100ms);  // the others ask first: their gets wait
        store.set("unique_id", std::string("id-from-rank-0"));
      }
      seen[rank] = store.get_string("unique_id");
      tickets[rank] = store.add("arrivals", 1);
    });
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < kRanks; ++rank) CHECK(seen[rank] == "id-from-rank-0");
  std::sort(tickets.begin(), tickets.end());
  CHECK(tickets == std::vector<int64_t>{1, 2, 3, 4});  // each add saw the previous ones
  TcpStore store("127.0.0.1", server.port(), 30s);
  CHECK(store.check("unique_id"));
  CHECK_FALSE(store.check("never_set"));
  CHECK(store.add("arrivals", -4) == 0);
  CHECK(store.add("fresh", 7) == 7);
  CHECK(server.stats().connections_accepted == kRanks + 1);
}

TEST_CASE("TcpStore: values are bytes, exact at any size up to the bound; a set replaces") {
  TcpStoreServer server(kLoopback, 0);
  TcpStore store("127.0.0.1", server.port(), 30s);
  std::vector<std::byte> big(3 * 1024 * 1024 + 7);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>((i * 131 + 17) % 251);
  store.set("big", big);
  CHECK(store.get("big") == big);
  const std::vector<std::byte> with_zeros{std::byte{0}, std::byte{255}, std::byte{0}};
  store.set("zeros", with_zeros);
  CHECK(store.get("zeros") == with_zeros);
  store.set("empty", std::vector<std::byte>{});
  CHECK(store.check("empty"));
  CHECK(store.get("empty").empty());
  store.set("zeros", std::string("replaced"));
  CHECK(store.get("zeros") == bytes_of("replaced"));
}

TEST_CASE("TcpStore: concurrent adds from many connections lose none") {
  TcpStoreServer server(kLoopback, 0);
  constexpr int kThreads = 4, kAdds = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      TcpStore store("127.0.0.1", server.port(), 30s);
      for (int i = 0; i < kAdds; ++i) store.add("counter", 1);
    });
  }
  for (auto& thread : threads) thread.join();
  TcpStore store("127.0.0.1", server.port(), 30s);
  CHECK(store.add("counter", 0) == kThreads * kAdds);
}

TEST_CASE("TcpStore: one store shared by threads serialises their requests on its connection") {
  TcpStoreServer server(kLoopback, 0);
  TcpStore store("127.0.0.1", server.port(), 30s);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string key = fmt::format("k{}_{}", t, i);
        store.set(key, key);
        CHECK(store.get_string(key) == key);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(server.stats().connections_accepted == 1);
}

TEST_CASE("TcpStore: a get of a key nobody sets ends at the timeout, naming the key and the server") {
  TcpStoreServer server(kLoopback, 0);
  TcpStore store("127.0.0.1", server.port(), 300ms);
  const Clock::time_point start = Clock::now();
  std::string message;
  try {
    store.get("nccl/never");
  } catch (const StoreTimeout& timeout) {
    message = timeout.what();
  }
  const double waited = store_seconds_since(start);
  CHECK(message == "TcpStore: get('nccl/never') at 127.0.0.1:" + std::to_string(server.port()) +
                       ": timed out after 0.3 s waiting for a rank to set the key");
  CHECK(waited >= 0.29);
  CHECK(waited < 20.0);
  // The store is usable after a timeout (on a fresh connection).
  store.set("after", std::string("ok"));
  CHECK(store.get_string("after") == "ok");
  CHECK(server.stats().connections_accepted == 2);
}

TEST_CASE("TcpStore: a barrier returns when every rank arrives; a timeout lists the missing ranks") {
  TcpStoreServer server(kLoopback, 0);
  std::vector<std::thread> ranks;
  std::atomic<int> passed{0};
  for (int rank = 0; rank < 3; ++rank) {
    ranks.emplace_back([&, rank] {
      TcpStore store("127.0.0.1", server.port(), 30s);
      store.barrier("start", rank, 3);
      passed.fetch_add(1);
    });
  }
  for (auto& rank : ranks) rank.join();
  CHECK(passed.load() == 3);

  ranks.clear();
  std::vector<std::string> messages(2);
  for (int rank = 0; rank < 2; ++rank) {  // ranks 2 and 3 of 4 never come
    ranks.emplace_back([&, rank] {
      TcpStore store("127.0.0.1", server.port(), 400ms);
      messages[rank] = message_of([&] { store.barrier("step", rank, 4); });
    });
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(messages[rank] == "TcpStore::barrier('step') at 127.0.0.1:" + std::to_string(server.port()) +
                                ": timed out after 0.4 s on rank " + std::to_string(rank) +
                                " of 4; ranks that did not arrive: 2, 3");
  }
}

TEST_CASE("TcpStore: clients may start before the server; without one, connect ends at the timeout") {
  const int port = free_port();
  std::string value;
  std::thread early([&] {
    TcpStore store("127.0.0.1", port, 30s);  // retries until the server listens
    value = store.get_string("late");
  });
  std::this_thread::sleep_for(300ms);
  TcpStoreServer server(kLoopback, port);
  TcpStore setter("127.0.0.1", port, 30s);
  setter.set("late", std::string("worth the wait"));
  early.join();
  CHECK(value == "worth the wait");

  const int closed_port = free_port();
  const Clock::time_point start = Clock::now();
  const std::string message = message_of([&] { TcpStore store("127.0.0.1", closed_port, 300ms); });
  CHECK(message.starts_with("dist::tcp: could not connect to 127.0.0.1:" + std::to_string(closed_port) + " within "));
  CHECK(message.ends_with("Connection refused"));
  CHECK(store_seconds_since(start) >= 0.2);
}

TEST_CASE("TcpStore: a server that goes away ends a waiting get with an error, not a hang") {
  auto server = std::make_unique<TcpStoreServer>(kLoopback, 0);
  const int port = server->port();
  TcpStore store("127.0.0.1", port, 30s);
  std::string message;
  std::thread waiter([&] { message = message_of([&] { store.get("never"); }); });
  std::this_thread::sleep_for(200ms);
  const Clock::time_point start = Clock::now();
  server.reset();
  waiter.join();
  CHECK(message == "TcpStore: get('never') at 127.0.0.1:" + std::to_string(port) +
                       ": the server closed the connection");
  CHECK(store_seconds_since(start) < 20.0);
}

TEST_CASE("TcpStore: bad arguments and hosts are errors naming them") {
  TcpStoreServer server(kLoopback, 0);
  CHECK(message_of([&] { TcpStoreServer second(kLoopback, server.port()); }) ==
        "dist::tcp: cannot listen on 127.0.0.1:" + std::to_string(server.port()) + ": Address already in use");
  CHECK(message_of([] { TcpStoreServer bad(kLoopback, 70000); }) == "dist::tcp: port 70000 is outside [0, 65535]");
  CHECK(message_of([] { TcpStore store("no-such-host.invalid", 29500, 5s); })
            .starts_with("dist::tcp: cannot resolve host 'no-such-host.invalid': "));
  CHECK(message_of([] { TcpStore store("127.0.0.1", 0, 1s); }) ==
        "dist::tcp: port 0 of 127.0.0.1 is outside [1, 65535]");
  CHECK(message_of([&] { TcpStore store("127.0.0.1", server.port(), 0ms); }) ==
        "TcpStore: the timeout must be positive, got 0 ms");
  TcpStore store("127.0.0.1", server.port(), 30s);
  CHECK(message_of([&] { store.set("", std::string("x")); }) == "TcpStore::set: the key is empty");
  CHECK(message_of([&] { store.get(std::string(5000, 'k')); }) ==
        "TcpStore::get: the key 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...' has 5000 bytes, above the 4096 a key may have");
  store.set("text", std::string("not a counter"));
  CHECK(message_of([&] { store.add("text", 1); }) ==
        "TcpStore: add('text') at 127.0.0.1:" + std::to_string(server.port()) +
            ": refused: TcpStoreServer: add('text'): the key holds 13 bytes set by set(), not a counter");
  CHECK(store.get_string("text") == "not a counter");  // reconnected after the refusal
  CHECK(message_of([&] { store.barrier("b", 3, 3); }) == "TcpStore::barrier('b'): rank 3 is outside [0, 3)");
}

TEST_CASE("TcpStore: a request outside the bounds is refused from its header, naming the bound; others go on") {
  TcpStoreServer server(kLoopback, 0);
  Socket raw = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  // The header alone: the value it announces is never sent, and never waited for.
  send_bytes(raw, protocol::encode({protocol::Op::set, 1, protocol::kMaxValueBytes + 1}));
  const Reply reply = receive_reply(raw);
  CHECK(reply.status == protocol::Status::refused);
  CHECK(reply.payload ==
        "TcpStoreServer: a value of 67108865 bytes is above the bound of 67108864 bytes a value (max_value_bytes)");
  CHECK(after_reply(raw) == "raw: the server closed the connection");
  TcpStore store("127.0.0.1", server.port(), 30s);
  store.set("fine", std::string("yes"));
  CHECK(store.get_string("fine") == "yes");
  CHECK(server.stats().largest_input_bytes == protocol::kRequestHeaderBytes + 4 + 3);  // store's set("fine", "yes")
}

TEST_CASE("TcpStoreServer: keys, values and the bytes held in all are bounded; each refusal names its bound") {
  StoreLimits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 1000;
  limits.max_total_bytes = 4050;
  TcpStoreServer server(kLoopback, 0, std::nullopt, limits);
  TcpStore store(kLoopback, server.port(), 30s);
  const std::string at = " at " + address_of(server) + ": refused: TcpStoreServer: ";
  const std::string long_key(65, 'k');
  CHECK(message_of([&] { store.set(long_key, std::string("v")); }) ==
        "TcpStore: set('" + long_key + "')" + at + "a key of 65 bytes is above the bound of 64 bytes a key (max_key_bytes)");
  CHECK(message_of([&] { store.set("big", std::string(1001, 'v')); }) ==
        "TcpStore: set('big')" + at + "a value of 1001 bytes is above the bound of 1000 bytes a value (max_value_bytes)");

  // A stranger's 12 largest values: those past the total are refused, and
  // the store holds no more than its bound.
  const std::string value(1000, 'v');
  for (int i = 0; i < 12; ++i) {
    const std::string key = "k" + std::to_string(i);
    const std::string message = message_of([&] { store.set(key, value); });
    if (i < 4) {
      CHECK(message == "(no error)");  // 4 x (2 + 1000) = 4008 bytes
    } else {
      CHECK(message == "TcpStore: set('" + key + "')" + at + "set('" + key + "') would make the store hold " +
                           std::to_string(4008 + key.size() + 1000) +
                           " bytes, above the bound of 4050 bytes in all (max_total_bytes)");
    }
  }
  CHECK(server.stats().held_bytes == 4008);
  store.set("k0", std::string(1000, 'w'));  // a replacement frees what it replaces
  CHECK(store.add("count", 5) == 5);        // 4008 + 5 + 8 bytes
  CHECK(store.add("count", 1) == 6);        // a counter that exists grows nothing
  const std::string counter(30, 'c');
  CHECK(message_of([&] { store.add(counter, 1); }) ==
        "TcpStore: add('" + counter + "')" + at + "add('" + counter +
            "') would make the store hold 4059 bytes, above the bound of 4050 bytes in all (max_total_bytes)");
  CHECK(store.get_string("k0") == std::string(1000, 'w'));
  CHECK(store.get_string("k3") == value);
  CHECK_FALSE(store.check("k4"));
  const TcpStoreServer::Stats stats = server.stats();
  CHECK(stats.held_bytes == 4021);
  CHECK(stats.largest_input_bytes <= limits.max_input_bytes());

  CHECK(message_of([] { TcpStoreServer zero(kLoopback, 0, std::nullopt, StoreLimits{.max_connections = 0}); })
            .starts_with("TcpStoreServer: every bound must be positive (max_key_bytes 4096, max_value_bytes 67108864, "
                         "max_total_bytes 268435456, max_connections 0, "));
}

TEST_CASE("TcpStoreServer: a flood of bytes behind a parked get is cut off at the bound a connection may buffer") {
  const std::string secret = new_job_secret();
  StoreLimits limits;
  limits.max_value_bytes = 64 * 1024;
  TcpStoreServer server(kLoopback, 0, secret, limits);
  Socket raw = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  send_bytes(raw, request_bytes(protocol::Op::authenticate, secret));
  REQUIRE(receive_reply(raw).status == protocol::Status::ok);
  send_bytes(raw, request_bytes(protocol::Op::get, "never/set"));
  CHECK(stats_when(server, [](const auto& stats) { return stats.parked_gets == 1; }).parked_gets == 1);

  // 1 GiB, far beyond what the socket buffers between the two hold.
  constexpr uint64_t kFlood = uint64_t{1} << 30;
  const std::vector<std::byte> chunk(64 * 1024, std::byte{0x5a});
  uint64_t sent = 0;
  std::string failure;
  while (sent < kFlood && failure.empty()) {
    failure = message_of([&] { send_all(raw, chunk, Clock::now() + 60s, "flood"); });
    if (failure == "(no error)") {
      failure.clear();
      sent += chunk.size();
    }
  }
  CAPTURE(sent);
  CHECK(failure.starts_with("flood: the connection failed while sending: "));
  const TcpStoreServer::Stats stats =
      stats_when(server, [](const auto& stats) { return stats.connections_open == 0; });
  CHECK(stats.connections_open == 0);
  CHECK(stats.parked_gets == 0);
  CHECK(stats.largest_input_bytes <= limits.max_input_bytes());
  TcpStore member(kLoopback, server.port(), 30s, secret);
  member.set("after", std::string("served"));
  CHECK(member.get_string("after") == "served");
}

TEST_CASE("TcpStoreServer: connections beyond the bound are refused naming it; the others go on") {
  const std::string secret = new_job_secret();
  StoreLimits limits;
  limits.max_connections = 3;
  TcpStoreServer server(kLoopback, 0, secret, limits);
  std::vector<std::unique_ptr<TcpStore>> members;
  for (int i = 0; i < 3; ++i) {
    members.push_back(std::make_unique<TcpStore>(kLoopback, server.port(), 30s, secret));
    members.back()->set("member/" + std::to_string(i), std::string("here"));
  }
  const std::string refusal =
      "TcpStoreServer: 3 connections are open, the bound (max_connections); this one is refused";
  CHECK(message_of([&] { TcpStore fourth(kLoopback, server.port(), 30s, secret); }) ==
        "TcpStore: authenticate at " + address_of(server) + ": refused: " + refusal);
  Socket stranger = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  const Reply reply = receive_reply(stranger);  // unasked: nothing was sent
  CHECK(reply.status == protocol::Status::refused);
  CHECK(reply.payload == refusal);
  CHECK(after_reply(stranger) == "raw: the server closed the connection");
  for (auto& member : members) CHECK(member->get_string("member/2") == "here");
  CHECK(server.stats().connections_refused == 2);

  members.pop_back();
  CHECK(stats_when(server, [](const auto& stats) { return stats.connections_open == 2; }).connections_open == 2);
  TcpStore next(kLoopback, server.port(), 30s, secret);
  CHECK(next.get_string("member/0") == "here");
}

TEST_CASE("TcpStore: with a job secret, a stranger who knows the port can neither set, get nor park") {
  const std::string secret = new_job_secret();
  TcpStoreServer server(kLoopback, 0, secret);
  CHECK(server.has_secret());
  TcpStore member(kLoopback, server.port(), 30s, secret);
  member.set("nccl/world/id", std::string("rank 0's id"));
  const std::string at = " at " + address_of(server) + ": refused: ";

  // A client without the secret: each request refused at once; none waits.
  TcpStore stranger(kLoopback, server.port(), 30s);
  const Clock::time_point start = Clock::now();
  CHECK(message_of([&] { stranger.set("nccl/world/id", std::string("forged")); }) ==
        "TcpStore: set('nccl/world/id')" + at + kUnauthenticated);
  CHECK(message_of([&] { stranger.get("nccl/world/id"); }) == "TcpStore: get('nccl/world/id')" + at + kUnauthenticated);
  CHECK(message_of([&] { stranger.get("never/set"); }) == "TcpStore: get('never/set')" + at + kUnauthenticated);
  CHECK(message_of([&] { stranger.add("arrivals", 1); }) == "TcpStore: add('arrivals')" + at + kUnauthenticated);
  CHECK(message_of([&] { stranger.check("nccl/world/id"); }) ==
        "TcpStore: check('nccl/world/id')" + at + kUnauthenticated);
  CHECK(store_seconds_since(start) < 20.0);  // the get of a missing key did not park for its 30 s

  const std::string wrong(32, '0');
  CHECK(message_of([&] { TcpStore guess(kLoopback, server.port(), 30s, wrong); }) ==
        "TcpStore: authenticate at " + address_of(server) + ": refused: " + kWrongSecret);

  // A wrong secret with a set behind it in the same packet: neither counts.
  Socket raw = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  std::vector<std::byte> both = request_bytes(protocol::Op::authenticate, wrong);
  const std::vector<std::byte> set = request_bytes(protocol::Op::set, "forged", "x");
  both.insert(both.end(), set.begin(), set.end());
  send_bytes(raw, both);
  CHECK(receive_reply(raw).payload == kWrongSecret);
  CHECK(after_reply(raw) == "raw: the server closed the connection");
  // An authentication longer than any secret is refused from its header, unread.
  Socket long_one = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  send_bytes(long_one, protocol::encode({protocol::Op::authenticate, uint32_t{1} << 30, 0}));
  CHECK(receive_reply(long_one).payload == kWrongSecret);
  CHECK(after_reply(long_one) == "raw: the server closed the connection");

  CHECK(member.get_string("nccl/world/id") == "rank 0's id");
  CHECK_FALSE(member.check("forged"));
  CHECK_FALSE(member.check("arrivals"));
  const TcpStoreServer::Stats stats = server.stats();
  CHECK(stats.held_bytes == std::string("nccl/world/id").size() + std::string("rank 0's id").size());
  CHECK(stats.parked_gets == 0);
  CHECK(stats.largest_input_bytes <= protocol::kRequestHeaderBytes + kLongestJobSecret);
}

TEST_CASE("TcpStoreServer: a connection that does not present the secret in time is closed") {
  StoreLimits limits;
  limits.admission_timeout = 300ms;
  TcpStoreServer server(kLoopback, 0, new_job_secret(), limits);
  const Clock::time_point start = Clock::now();
  Socket idle = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  const Reply reply = receive_reply(idle);
  const double waited = store_seconds_since(start);
  CHECK(reply.payload == "TcpStoreServer: the job secret did not come within 300 ms of connecting");
  CHECK(after_reply(idle) == "raw: the server closed the connection");
  CHECK(waited >= 0.29);
  CHECK(waited < 30.0);
}

TEST_CASE("TcpStoreServer: without a job secret it serves loopback only; a secret it has is checked") {
  const std::string message = message_of([] { TcpStoreServer open_to_all(kEveryInterface, 0); });
  CHECK(message.starts_with("TcpStoreServer: a store on port "));
  CHECK(message.ends_with(" of every interface is reachable from other hosts, so it needs a job secret "
                          "(TESSERA_JOB_SECRET) to admit only its job's processes; without one it serves on loopback "
                          "only"));
  CHECK(message_of([] { TcpStoreServer short_secret(kLoopback, 0, std::string("short")); }) ==
        "TcpStoreServer: a job secret holds 16 to 256 characters, this one 5");

  const std::string secret = new_job_secret();
  TcpStoreServer everywhere(kEveryInterface, 0, secret);
  TcpStore member(kLoopback, everywhere.port(), 30s, secret);
  member.set("k", std::string("v"));
  CHECK(member.get_string("k") == "v");

  TcpStoreServer without(kLoopback, 0);
  CHECK_FALSE(without.has_secret());
  CHECK(message_of([&] { TcpStore with_one(kLoopback, without.port(), 30s, secret); }) ==
        "TcpStore: authenticate at " + address_of(without) +
            ": refused: TcpStoreServer: this store has no job secret (rank 0 started it without TESSERA_JOB_SECRET): "
            "set the same secret for every rank, or for none when all are on one host");
  CHECK(is_loopback_host("127.0.0.1"));
  CHECK(is_loopback_host("127.1.2.3"));
  CHECK(is_loopback_host("::1"));
  CHECK(is_loopback_host("localhost"));
  CHECK_FALSE(is_loopback_host("10.0.0.1"));
  CHECK_FALSE(is_loopback_host("node0"));
  CHECK_FALSE(is_loopback_host(""));
}

TEST_CASE("TcpStore: ranks as processes exchange rank 0's id through the launch variables") {
  const int port = free_port();
  const auto environment = [port](const std::string& name) -> std::optional<std::string> {
    if (name == "MASTER_ADDR") return "localhost";
    if (name == "MASTER_PORT") return std::to_string(port);
    return std::nullopt;
  };
  constexpr int kWorld = 3;
  std::vector<pid_t> children;
  for (int rank = 1; rank < kWorld; ++rank) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // a rank: only store calls, then _exit with the verdict
      int code = 1;
      try {
        LaunchStore launch = connect_launch_store({.rank = rank, .world_size = kWorld}, 60s, environment);
        const std::string id = launch.store->get_string("nccl/world/id");
        launch.store->set("seen/" + std::to_string(rank), id);
        launch.store->barrier("done", rank, kWorld);
        code = id == "0123456789abcdef" ? 0 : 2;
      } catch (...) {
        code = 3;
      }
      ::_exit(code);
    }
    children.push_back(child);
  }
  LaunchStore launch = connect_launch_store({.rank = 0, .world_size = kWorld}, 60s, environment);
  REQUIRE(launch.server != nullptr);
  launch.store->set("nccl/world/id", std::string("0123456789abcdef"));
  launch.store->barrier("done", 0, kWorld);
  CHECK(launch.store->get_string("seen/1") == "0123456789abcdef");
  CHECK(launch.store->get_string("seen/2") == "0123456789abcdef");
  for (const pid_t child : children) {
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("connect_launch_store: missing or malformed variables are errors naming them") {
  const auto with = [](std::optional<std::string> address, std::optional<std::string> port) {
    return [=](const std::string& name) -> std::optional<std::string> {
      if (name == "MASTER_ADDR") return address;
      if (name == "MASTER_PORT") return port;
      return std::nullopt;
    };
  };
  const LaunchInfo rank1{.rank = 1, .world_size = 2};
  CHECK(message_of([&] { connect_launch_store(rank1, 1s, with(std::nullopt, "29500")); }) ==
        "dist::connect_launch_store: MASTER_ADDR is not set; a torchrun-style launch names the host of rank 0 in it");
  CHECK(message_of([&] { connect_launch_store(rank1, 1s, with("node0", std::nullopt)); }) ==
        "dist::connect_launch_store: MASTER_PORT is not set; a torchrun-style launch names rank 0's store port in it");
  for (const char* bad : {"", "http", "0", "65536", "29500x"}) {
    CHECK(message_of([&] { connect_launch_store(rank1, 1s, with("node0", bad)); }) ==
          std::string("dist::connect_launch_store: MASTER_PORT='") + bad + "' is not a port in [1, 65535]");
  }
}

TEST_CASE("connect_launch_store: a world of one serves on loopback alone, with a secret of its own") {
  const int port = free_port();
  // MASTER_ADDR as a cluster sets it: a world of one reaches itself on loopback whatever it says.
  const Variables variables{{"MASTER_ADDR", first_external_ipv4().value_or("node0")}, {"MASTER_PORT", std::to_string(port)}};
  LaunchStore launch = connect_launch_store({.launcher = Launcher::torchrun, .rank = 0, .world_size = 1}, 30s,
                                            environment_of(variables));
  REQUIRE(launch.server != nullptr);
  CHECK(launch.server->port() == port);
  CHECK(launch.server->has_secret());
  CHECK(launch.store->endpoint() == "127.0.0.1:" + std::to_string(port));
  launch.store->set("nccl/world/id", std::string("mine"));
  CHECK(launch.store->get_string("nccl/world/id") == "mine");
  TcpStore stranger(kLoopback, port, 30s);
  CHECK(message_of([&] { stranger.get("nccl/world/id"); }) ==
        "TcpStore: get('nccl/world/id') at 127.0.0.1:" + std::to_string(port) + ": refused: " + kUnauthenticated);
  check_unreachable_from_outside(port);
  launch.leave(0, 1);
}

TEST_CASE("connect_launch_store: MASTER_ADDR on loopback serves there; one other hosts reach needs the job secret") {
  const std::string secret = new_job_secret();
  const auto variables = [](const std::string& address, int port, std::optional<std::string> job_secret) {
    Variables result{{"MASTER_ADDR", address}, {"MASTER_PORT", std::to_string(port)}};
    if (job_secret) result["TESSERA_JOB_SECRET"] = *job_secret;
    return environment_of(result);
  };
  const LaunchInfo rank0{.launcher = Launcher::torchrun, .rank = 0, .world_size = 2};
  const LaunchInfo rank1{.launcher = Launcher::torchrun, .rank = 1, .world_size = 2};

  // Every rank on this host, no secret (a torchrun-style launch of today): served on loopback only.
  {
    const int port = free_port();
    LaunchStore launch = connect_launch_store(rank0, 30s, variables("127.0.0.1", port, std::nullopt));
    CHECK_FALSE(launch.server->has_secret());
    launch.store->set("k", std::string("v"));
    check_unreachable_from_outside(port);
  }
  // The same with the secret: admitted by it.
  {
    const int port = free_port();
    LaunchStore launch = connect_launch_store(rank0, 30s, variables("localhost", port, secret));
    CHECK(launch.server->has_secret());
    TcpStore other_rank("localhost", port, 30s, secret);
    other_rank.set("k", std::string("v"));
    CHECK(launch.store->get_string("k") == "v");
    CHECK(message_of([&] { TcpStore("localhost", port, 30s).set("k", std::string("forged")); })
              .ends_with(kUnauthenticated));
    check_unreachable_from_outside(port);
  }
  // An address other hosts reach, without the secret: every rank refuses to start.
  for (const LaunchInfo& launch : {rank0, rank1}) {
    const int port = free_port();
    CHECK(message_of([&] { connect_launch_store(launch, 30s, variables("10.1.2.3", port, std::nullopt)); }) ==
          "dist::connect_launch_store: MASTER_ADDR=10.1.2.3 is reached from other hosts, so the rendezvous store "
          "admits only the job's processes, by a secret they share; set TESSERA_JOB_SECRET to the same value for "
          "every rank (for example `export TESSERA_JOB_SECRET=$(openssl rand -hex 16)` where the ranks are "
          "started; docs/distributed.md#security-model)");
    CHECK(message_of([&] { connect_tcp("127.0.0.1", port, Clock::now() + 300ms); }).ends_with("Connection refused"));
  }
  // With it: served on every interface, to the ranks that present it.
  if (const std::optional<std::string> external = first_external_ipv4()) {
    const int port = free_port();
    LaunchStore launch = connect_launch_store(rank0, 30s, variables(*external, port, secret));
    CHECK(launch.server->has_secret());
    TcpStore other_rank(*external, port, 30s, secret);
    other_rank.set("k", std::string("v"));
    CHECK(launch.store->get_string("k") == "v");
    CHECK(message_of([&] { TcpStore(*external, port, 30s).get("k"); }).ends_with(kUnauthenticated));
  } else {
    MESSAGE("no IPv4 address other than loopback on this machine: the store on every interface is not checked");
  }
  CHECK(message_of([&] { connect_launch_store(rank1, 1s, variables("node0", 29500, "short")); }) ==
        "TESSERA_JOB_SECRET must hold 16 to 256 characters, it holds 5");
}

TEST_CASE("connect_store_through: a group that can talk hands every rank rank 0's store") {
  const auto environment = [](const std::string& name) -> std::optional<std::string> {
    if (name == "MASTER_ADDR") return "127.0.0.1";
    return std::nullopt;  // no MASTER_PORT: rank 0 takes a port the system picks
  };
  std::vector<std::string> seen(3);
  std::vector<int> serves(3);  // not vector<bool>: ranks write their own element from their threads
  run_local(3, [&](const ProcessGroupPtr& world) {
    LaunchStore launch = connect_store_through(*world, 30s, environment);
    serves[static_cast<size_t>(world->rank())] = launch.server != nullptr ? 1 : 0;
    if (world->rank() == 0) {
      // The group handed out a secret of rank 0's making (TESSERA_JOB_SECRET is not set).
      CHECK(launch.server->has_secret());
      CHECK(message_of([&] { TcpStore(kLoopback, launch.server->port(), 30s).check("k"); }).ends_with(kUnauthenticated));
      launch.store->set("nccl/world/id", std::string("from rank 0"));
    }
    seen[static_cast<size_t>(world->rank())] = launch.store->get_string("nccl/world/id");
    launch.leave(world->rank(), world->size());
    CHECK(launch.store == nullptr);
    CHECK(launch.server == nullptr);
  });
  CHECK(serves == std::vector<int>{1, 0, 0});
  CHECK(seen == std::vector<std::string>(3, "from rank 0"));
}

TEST_CASE("connect_store_through: a group of one serves on loopback alone") {
  run_local(1, [&](const ProcessGroupPtr& world) {
    LaunchStore launch = connect_store_through(*world, 30s, environment_of({}));
    REQUIRE(launch.server != nullptr);
    CHECK(launch.server->has_secret());
    CHECK(launch.store->endpoint() == "127.0.0.1:" + std::to_string(launch.server->port()));
    launch.store->set("k", std::string("v"));
    CHECK(launch.store->get_string("k") == "v");
    check_unreachable_from_outside(launch.server->port());
    launch.leave(0, 1);
  });
}
