// A process killed with SIGKILL in the middle of a save, at every save point
// and at random moments, leaves the previous checkpoint loadable and intact:
// the latest complete checkpoint always holds exactly one step's values.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tests/checkpoint/known_state.h"
#include "tests/checkpoint/temp_dir.h"
#include "train/checkpoint_manager.h"

using namespace tessera;
using namespace tessera::checkpoint;
using namespace tessera::train;
using tessera::checkpoint::testing::TempDir;

namespace {

const char* child_program() {
  const char* path = std::getenv("TESSERA_SAVE_CHILD");
  REQUIRE_MESSAGE(path != nullptr, "TESSERA_SAVE_CHILD must name the save_child program (meson test sets it)");
  return path;
}

struct Child {
  pid_t pid = -1;
  int output = -1;  // the read end of the child's stdout
};

Child spawn_save(const std::string& root, int64_t step, const std::string& pause) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const std::string step_text = std::to_string(step);
  const char* program = child_program();  // before the fork: the child only execs
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl(program, program, root.c_str(), step_text.c_str(), pause.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Blocks until the child prints "paused" (it reached its save point).
bool wait_until_paused(const Child& child) {
  std::string seen;
  char c;
  while (::read(child.output, &c, 1) == 1) {
    seen += c;
    if (seen.find("paused") != std::string::npos) return true;
  }
  return false;
}

int reap(Child& child) {
  int status = 0;
  ::waitpid(child.pid, &status, 0);
  ::close(child.output);
  return status;
}

void kill_and_reap(Child& child) {
  ::kill(child.pid, SIGKILL);
  const int status = reap(child);
  CHECK(WIFSIGNALED(status));
}

// The latest checkpoint loads (checksums verified) and holds one step's
// values; returns that step.
int64_t check_latest_intact(const std::string& root) {
  const std::optional<CheckpointEntry> latest = latest_checkpoint(root);
  REQUIRE(latest.has_value());
  const DistributedStateDict state = checkpoint::testing::zero_state(nullptr);
  const LoadReport report = load(latest->path, state);
  CHECK(report.training_state.at("step") == latest->step);
  CHECK(checkpoint::testing::check_known_state(state, latest->step) == "");
  return latest->step;
}

}  // namespace

TEST_CASE("checkpoint: SIGKILL at every save point leaves a loadable, intact latest checkpoint") {
  TempDir tmp;
  const std::string root = tmp / "run";
  Child first = spawn_save(root, 1, "none");
  REQUIRE(reap(first) == 0);
  CHECK(check_latest_intact(root) == 1);

  struct Case {
    int64_t step;
    const char* point;
    int64_t latest_after;  // the step the latest checkpoint must hold after the kill
  };
  // keep_last is 2: step 5's save prunes step 1 (4 and 5 stay).
  for (const Case& kill : {Case{2, "rank_file_written", 1}, Case{3, "metadata_written", 1}, Case{4, "committed", 4},
                           Case{5, "pruning", 5}}) {
    CAPTURE(kill.point);
    Child child = spawn_save(root, kill.step, kill.point);
    REQUIRE(wait_until_paused(child));
    kill_and_reap(child);
    CHECK(check_latest_intact(root) == kill.latest_after);
    // Every complete checkpoint, not only the latest, is intact.
    for (const CheckpointEntry& entry : list_checkpoints(root)) {
      const DistributedStateDict state = checkpoint::testing::zero_state(nullptr);
      load(entry.path, state);
      CHECK(checkpoint::testing::check_known_state(state, entry.step) == "");
    }
  }
  // The kill at "pruning" left step 1 renamed aside, never as a torn step-1.
  CHECK(!std::filesystem::exists(checkpoint_path(root, 1)));
  CHECK(std::filesystem::exists(checkpoint_path(root, 1) + ".deleting"));
  // A new manager clears what the killed saves left behind.
  { CheckpointManager manager(root); }
  for (const auto& child : std::filesystem::directory_iterator(root)) {
    const std::string name = child.path().filename().string();
    CHECK_MESSAGE(!name.ends_with(".tmp"), name);
    CHECK_MESSAGE(!name.ends_with(".deleting"), name);
  }
}

TEST_CASE("checkpoint: SIGKILL at random moments of a save never tears the latest checkpoint") {
  TempDir tmp;
  const std::string root = tmp / "run";
  Child first = spawn_save(root, 1, "none");
  REQUIRE(reap(first) == 0);
  // A child saves in about 40-70 ms here (start-up included); the delays, 0 to
  // 77 ms, sweep across it.
  int64_t completed = 0, torn = 0;
  for (int64_t step = 2; step <= 13; ++step) {
    CAPTURE(step);
    Child child = spawn_save(root, step, "none");
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * (step - 2)));
    ::kill(child.pid, SIGKILL);
    const int status = reap(child);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++completed;
    if (std::filesystem::exists(checkpoint_path(root, step) + ".tmp")) ++torn;  // killed mid-save
    const int64_t latest = check_latest_intact(root);
    CHECK(latest <= step);
    if (WIFEXITED(status)) CHECK(latest == step);  // finished before the kill
  }
  MESSAGE("of 12 saves, " << torn << " were killed mid-write and " << completed << " finished first");
}
