// CollectiveProgress: what a timed-out rank learns from the store about who
// never issued the collective (the NCCL watchdog's message), on the cpu.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "dist/backends/collective_progress.h"
#include "dist/launch/tcp_store.h"

using namespace tessera::dist;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<TcpStore> connect(const TcpStoreServer& server) {
  return std::make_shared<TcpStore>("127.0.0.1", server.port(), 10s);
}

}  // namespace

TEST_CASE("CollectiveProgress: the ranks behind a collective, with what each issued last") {
  TcpStoreServer server("127.0.0.1", 0);
  CollectiveProgress rank0(connect(server), "nccl/world", 0, 4);
  CollectiveProgress rank1(connect(server), "nccl/world", 1, 4);
  CollectiveProgress rank2(connect(server), "nccl/world", 2, 4);
  rank0.post(7);
  rank1.post(-1);  // arrived, issued nothing yet
  rank2.post(5);
  rank2.post(7);  // the latest counts
  // Rank 3 never arrived.

  const auto behind = rank0.ranks_behind(7);
  REQUIRE(behind.size() == 2);
  CHECK(behind[0].rank == 1);
  CHECK(behind[0].issued == std::optional<int64_t>(-1));
  CHECK(behind[1].rank == 3);
  CHECK_FALSE(behind[1].issued.has_value());
  CHECK(rank0.describe_missing(7) == "ranks that never issued #7: 1 (none issued yet), 3 (never arrived)");
  CHECK(rank2.describe_missing(6) == "ranks that never issued #6: 1 (none issued yet), 3 (never arrived)");
  // At a group's creation only the ranks that never came are missing.
  CHECK(rank0.describe_missing(-1) == "ranks that never arrived: 3 (never arrived)");

  CollectiveProgress rank3(connect(server), "nccl/world", 3, 4);
  rank3.post(9);
  rank1.post(8);
  CHECK(rank0.ranks_behind(7).empty());
  CHECK(rank0.describe_missing(7) ==
        "every rank issued it: a rank may have died or stalled inside it, or a link between GPUs failed");
  CHECK(rank3.describe_missing(9) == "ranks that never issued #9: 0 (its latest: #7), 1 (its latest: #8), "
                                     "2 (its latest: #7)");
}

TEST_CASE("CollectiveProgress: groups under different prefixes do not see each other") {
  TcpStoreServer server("127.0.0.1", 0);
  CollectiveProgress world(connect(server), "nccl/world", 0, 2);
  CollectiveProgress other_world_rank1(connect(server), "nccl/world", 1, 2);
  CollectiveProgress shard(connect(server), "nccl/world/shard.0.0", 0, 2);
  other_world_rank1.post(3);
  CHECK(world.describe_missing(3) ==
        "every rank issued it: a rank may have died or stalled inside it, or a link between GPUs failed");
  CHECK(shard.describe_missing(0) == "ranks that never issued #0: 1 (never arrived)");
}

TEST_CASE("CollectiveProgress: a store that went away is reported, not waited for") {
  std::shared_ptr<TcpStore> store;
  std::optional<CollectiveProgress> progress;
  {
    TcpStoreServer server("127.0.0.1", 0);
    store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 500ms);
    progress.emplace(store, "nccl/world", 0, 2);
    progress->post(1);
  }
  progress->post(2);  // kept quiet: progress is advisory
  const std::string message = progress->describe_missing(2);
  CHECK(message.starts_with("which ranks issued it is unknown: the store at 127.0.0.1:"));
  CHECK(message.find("cannot be read") != std::string::npos);
}

TEST_CASE("CollectiveProgress: bad construction is an error") {
  TcpStoreServer server("127.0.0.1", 0);
  CHECK_THROWS_WITH(CollectiveProgress(nullptr, "p", 0, 1), "CollectiveProgress 'p': no store");
  CHECK_THROWS_WITH(CollectiveProgress(connect(server), "p", 2, 2), "CollectiveProgress 'p': rank 2 is outside [0, 2)");
}
