// dist::TcpStore and TcpStoreServer: the rendezvous of a torchrun-style
// launch, over real TCP sockets on this machine. Ranks are threads here and,
// in one case, forked processes. Timeouts are asserted from below (a wait
// lasts at least its timeout) and bounded generously from above, so a busy
// machine does not fail them.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/backends/local_backend.h"
#include "dist/launch/store_protocol.h"
#include "dist/launch/tcp_store.h"
#include "tests/dist/error_message.h"

using namespace tessera;
using namespace tessera::dist;
using tessera::test::message_of;
using namespace std::chrono_literals;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::vector<std::byte> bytes_of(const std::string& text) {
  const auto view = std::as_bytes(std::span(text));
  return {view.begin(), view.end()};
}

// A port that was free a moment ago (the system's pick, then released).
int free_port() {
  TcpStoreServer probe(0);
  return probe.port();
}

}  // namespace

TEST_CASE("TcpStore: set, get, add and check between ranks on threads; get waits for the set") {
  TcpStoreServer server(0);
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
  CHECK(server.connections_accepted() == kRanks + 1);
}

TEST_CASE("TcpStore: values are bytes, exact at any size up to the bound; a set replaces") {
  TcpStoreServer server(0);
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
  TcpStoreServer server(0);
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
  TcpStoreServer server(0);
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
  CHECK(server.connections_accepted() == 1);
}

TEST_CASE("TcpStore: a get of a key nobody sets ends at the timeout, naming the key and the server") {
  TcpStoreServer server(0);
  TcpStore store("127.0.0.1", server.port(), 300ms);
  const Clock::time_point start = Clock::now();
  std::string message;
  try {
    store.get("nccl/never");
  } catch (const StoreTimeout& timeout) {
    message = timeout.what();
  }
  const double waited = seconds_since(start);
  CHECK(message == "TcpStore: get('nccl/never') at 127.0.0.1:" + std::to_string(server.port()) +
                       ": timed out after 0.3 s waiting for a rank to set the key");
  CHECK(waited >= 0.29);
  CHECK(waited < 20.0);
  // The store is usable after a timeout (on a fresh connection).
  store.set("after", std::string("ok"));
  CHECK(store.get_string("after") == "ok");
  CHECK(server.connections_accepted() == 2);
}

TEST_CASE("TcpStore: a barrier returns when every rank arrives; a timeout lists the missing ranks") {
  TcpStoreServer server(0);
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
  TcpStoreServer server(port);
  TcpStore setter("127.0.0.1", port, 30s);
  setter.set("late", std::string("worth the wait"));
  early.join();
  CHECK(value == "worth the wait");

  const int closed_port = free_port();
  const Clock::time_point start = Clock::now();
  const std::string message = message_of([&] { TcpStore store("127.0.0.1", closed_port, 300ms); });
  CHECK(message.starts_with("dist::tcp: could not connect to 127.0.0.1:" + std::to_string(closed_port) + " within "));
  CHECK(message.ends_with("Connection refused"));
  CHECK(seconds_since(start) >= 0.2);
}

TEST_CASE("TcpStore: a server that goes away ends a waiting get with an error, not a hang") {
  auto server = std::make_unique<TcpStoreServer>(0);
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
  CHECK(seconds_since(start) < 20.0);
}

TEST_CASE("TcpStore: bad arguments and hosts are errors naming them") {
  TcpStoreServer server(0);
  CHECK(message_of([&] { TcpStoreServer second(server.port()); }) ==
        "dist::tcp: cannot listen on port " + std::to_string(server.port()) + ": Address already in use");
  CHECK(message_of([] { TcpStoreServer bad(70000); }) == "dist::tcp: port 70000 is outside [0, 65535]");
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

TEST_CASE("TcpStore: a connection sending a request outside the bounds is refused and closed; others go on") {
  TcpStoreServer server(0);
  Socket raw = connect_tcp("127.0.0.1", server.port(), Clock::now() + 30s);
  const auto header = store_protocol::encode({store_protocol::Op::set, 1, store_protocol::kMaxValueBytes + 1});
  send_all(raw, header, Clock::now() + 30s, "raw");
  std::array<std::byte, store_protocol::kReplyHeaderBytes> reply{};
  receive_all(raw, reply, Clock::now() + 30s, "raw");
  CHECK(static_cast<store_protocol::Status>(reply[0]) == store_protocol::Status::refused);
  std::string text(store_protocol::get_le(reply.data() + 1, 8), '\0');
  receive_all(raw, std::as_writable_bytes(std::span(text)), Clock::now() + 30s, "raw");
  CHECK(text == "TcpStoreServer: a request with a key of 1 bytes and a value of 67108865 bytes is outside the "
                "store's bounds");
  std::byte extra{};
  CHECK(message_of([&] { receive_all(raw, std::span(&extra, 1), Clock::now() + 30s, "raw"); }) ==
        "raw: the server closed the connection");
  TcpStore store("127.0.0.1", server.port(), 30s);
  store.set("fine", std::string("yes"));
  CHECK(store.get_string("fine") == "yes");
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
    if (world->rank() == 0) launch.store->set("nccl/world/id", std::string("from rank 0"));
    seen[static_cast<size_t>(world->rank())] = launch.store->get_string("nccl/world/id");
    launch.leave(world->rank(), world->size());
    CHECK(launch.store == nullptr);
    CHECK(launch.server == nullptr);
  });
  CHECK(serves == std::vector<int>{1, 0, 0});
  CHECK(seen == std::vector<std::string>(3, "from rank 0"));
}
