// CheckpointManager: a run's checkpoints under one root directory,
//   ROOT/step-00000100/   (one checkpoint: metadata.json + rank files)
// saved sync or async (the next save waits for the previous one), the last
// K kept, and the latest complete one found for --resume. A directory counts
// only when it is named step-N and holds metadata.json, which save writes
// last and commits by rename, so half-written saves (step-N.tmp) and
// checkpoints being deleted (step-N.deleting) are never picked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/async_save.h"

namespace tessera::checkpoint {

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};

// The complete checkpoints under `root`, oldest first (none when root is absent).
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);
// The newest complete checkpoint under `root`.
std::optional<CheckpointEntry> latest_checkpoint(const std::string& root);
// ROOT/step-NNNNNNNN.
std::string checkpoint_path(const std::string& root, int64_t step);

struct ManagerOptions {
  dist::ProcessGroupPtr group = nullptr;  // the saving ranks; null: dist::world(), or this process alone
  int keep_last = 0;                      // after each commit delete all but the newest K; 0 keeps all
  bool sync = true;                       // fsync (off only for tests of speed)
};

class CheckpointManager {
 public:
  // Collective over the group (it splits off the group async saves use).
  CheckpointManager(std::string root, ManagerOptions options = {});
  ~CheckpointManager();  // waits for a pending async save (its error is printed, not thrown)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves `state` as checkpoint `step` and prunes; returns its path. Waits for
  // a pending async save first.
  std::string save(int64_t step, const DistributedStateDict& state, const nlohmann::json& training_state);
  // Snapshots now, writes in the background (then prunes); returns at once
  // after waiting for the previous async save.
  SaveHandle async_save(int64_t step, const DistributedStateDict& state, const nlohmann::json& training_state);
  // Waits for the pending async save, if any; rethrows its error.
  void wait();

  const std::string& root() const { return root_; }
  std::optional<CheckpointEntry> latest() const { return latest_checkpoint(root_); }

 private:
  void prune(int rank) const;

  std::string root_;
  ManagerOptions options_;
  dist::ProcessGroupPtr group_;        // synchronous saves
  dist::ProcessGroupPtr async_group_;  // background saves: used by nothing else
  SaveHandle pending_;
  SnapshotBuffers snapshot_buffers_;  // reused by every async save: one copy of this rank's shards
};

}  // namespace tessera::checkpoint
