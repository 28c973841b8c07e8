// The checkpoint manager: step directories, the latest complete checkpoint,
// keep-last-K, and async saves in order.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <fstream>

#include "dist/backends/local_backend.h"
#include "tests/checkpoint/known_state.h"
#include "tests/checkpoint/temp_dir.h"
#include "train/checkpoint_manager.h"

using namespace tessera;
using namespace tessera::checkpoint;
using namespace tessera::train;
using tessera::checkpoint::testing::TempDir;
namespace fs = std::filesystem;

TEST_CASE("checkpoint manager: latest is the newest complete step directory") {
  TempDir tmp;
  const std::string root = tmp / "run";
  CHECK(!latest_checkpoint(root).has_value());  // no root yet
  CheckpointManager manager(root);
  CHECK(!manager.latest().has_value());
  manager.save(7, testing::known_state(nullptr, 7, 10), {{"step", 7}});
  manager.save(12, testing::known_state(nullptr, 12, 10), {{"step", 12}});
  CHECK(checkpoint_path(root, 12) == (fs::path(root) / "step-00000012").string());
  // Unfinished or foreign directories never count.
  fs::create_directories(checkpoint_path(root, 30) + ".tmp");
  fs::create_directories(checkpoint_path(root, 31));  // no metadata.json
  fs::create_directories(fs::path(root) / "step-4x");
  fs::create_directories(fs::path(root) / "notes");
  const auto latest = manager.latest();
  REQUIRE(latest.has_value());
  CHECK(latest->step == 12);
  const auto all = list_checkpoints(root);
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 7);
  const DistributedStateDict loaded = testing::zero_state(nullptr, 10);
  load(latest->path, loaded);
  CHECK(testing::check_known_state(loaded, 12) == "");
}

TEST_CASE("checkpoint manager: keep_last keeps the newest K, also for async saves on 3 ranks") {
  TempDir tmp;
  const std::string root = tmp / "run";
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    CheckpointManager manager(root, {.group = group, .keep_last = 2, .sync = false});
    for (int64_t step = 1; step <= 5; ++step) {
      if (step % 2 == 0) {
        manager.save(step, testing::known_state(group, step, 40), {{"step", step}});
      } else {
        manager.async_save(step, testing::known_state(group, step, 40), {{"step", step}});
      }
    }
    manager.wait();
    group->barrier();
  });
  const auto kept = list_checkpoints(root);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].step == 4);
  CHECK(kept[1].step == 5);
  std::vector<std::string> entries;
  for (const auto& child : fs::directory_iterator(root)) entries.push_back(child.path().filename().string());
  std::sort(entries.begin(), entries.end());
  CHECK(entries == std::vector<std::string>{".lock", "run.json", "step-00000004", "step-00000005"});  // nothing left aside
  const DistributedStateDict loaded = testing::zero_state(nullptr, 40);
  load(kept[1].path, loaded);
  CHECK(testing::check_known_state(loaded, 5) == "");
}

TEST_CASE("checkpoint manager: the next save waits for the previous async one") {
  TempDir tmp;
  const std::string root = tmp / "run";
  CheckpointManager manager(root, {.group = nullptr, .keep_last = 0, .sync = false});
  const SaveHandle first = manager.async_save(1, testing::known_state(nullptr, 1, 3000), {{"step", 1}});
  manager.save(2, testing::known_state(nullptr, 2, 10), {{"step", 2}});
  CHECK(first.ready());
  CHECK(list_checkpoints(root).size() == 2);
}

TEST_CASE("checkpoint manager: bad options and a step saved twice are clear errors") {
  TempDir tmp;
  CHECK_THROWS_WITH_AS(CheckpointManager("", {}), doctest::Contains("root directory is empty"), Error);
  CHECK_THROWS_WITH_AS(CheckpointManager(tmp / "x", {.group = nullptr, .keep_last = -1, .sync = true}),
                       doctest::Contains("keep_last must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(checkpoint_path("r", -3), doctest::Contains("step must be >= 0"), Error);
  CheckpointManager manager(tmp / "run", {.group = nullptr, .keep_last = 0, .sync = false});
  manager.save(3, testing::known_state(nullptr, 3, 10), {});
  CHECK_THROWS_WITH_AS(manager.save(3, testing::known_state(nullptr, 3, 10), {}), doctest::Contains("already exists"),
                       Error);
  manager.async_save(3, testing::known_state(nullptr, 3, 10), {});
  CHECK_THROWS_WITH_AS(manager.wait(), doctest::Contains("already exists"), Error);
}

TEST_CASE("checkpoint manager: a root that cannot be created fails on every rank, not only rank 0") {
  TempDir tmp;
  { std::ofstream file(tmp / "plain-file"); }
  std::atomic<int> errors{0};
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    try {
      CheckpointManager manager(tmp / "plain-file/run", {.group = group, .keep_last = 0, .sync = false});
    } catch (const Error& error) {
      if (std::string(error.what()).find("rank 0 failed") != std::string::npos) ++errors;
    }
  });
  CHECK(errors == 3);
}
