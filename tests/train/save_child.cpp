// The process the kill tests kill: saves checkpoint STEP of a known state
// under ROOT with a CheckpointManager (2 local ranks, keep the last 2), and
// when PAUSE names a save point, prints "paused" when a rank reaches it and
// sleeps there until the test kills it with SIGKILL.
//
//   save_child ROOT STEP PAUSE      (PAUSE: a save point, or "none")
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/save_points.h"
#include "dist/backends/local_backend.h"
#include "tests/checkpoint/known_state.h"
#include "train/checkpoint_manager.h"

using namespace tessera;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: save_child ROOT STEP PAUSE\n");
    return 2;
  }
  const std::string root = argv[1];
  const int64_t step = std::atoll(argv[2]);
  const std::string pause = argv[3];
  checkpoint::set_save_point_observer([pause](std::string_view point) {
    if (point != pause) return;
    std::printf("paused\n");
    std::fflush(stdout);
    for (;;) ::pause();
  });
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    tessera::train::CheckpointManager manager(root, {.group = group, .keep_last = 2, .sync = true});
    manager.save(step, checkpoint::testing::known_state(group, step), {{"step", step}});
  });
  return 0;
}
