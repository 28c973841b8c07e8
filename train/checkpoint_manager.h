// CheckpointManager: a run's checkpoints under one root directory,
//   ROOT/run.json          which run owns the root (run_record.h)
//   ROOT/step-00000100/    one checkpoint: metadata.json + rank files
// saved sync or async (the next save waits for the previous one), the last
// K of this run's checkpoints kept, and the latest found for a resume. A
// directory counts only when it is named step-N and holds metadata.json,
// which save writes last and commits by rename, so half-written saves
// (step-N.tmp) and checkpoints being deleted (step-N.deleting) are never picked.
//
// Opening a root is where every surprise is found, before the first step:
// another run's root, another run's checkpoint copied in, a step-N without
// metadata (tessera never leaves one: it was copied or edited), a damaged
// newest checkpoint, a root that cannot be written on some rank, a second
// launch holding the root. Each is an error naming the path; the manager
// never prunes, overwrites or resumes what is not its run's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/async_save.h"

namespace tessera::train {

class RootLock;

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};

// The complete checkpoints under `root` (any run's), oldest first (none when root is absent).
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);
// The newest complete checkpoint under `root`.
std::optional<CheckpointEntry> latest_checkpoint(const std::string& root);
// ROOT/step-NNNNNNNN.
std::string checkpoint_path(const std::string& root, int64_t step);
// Why the checkpoint at `path` is not the one its name says, "" when it is:
// a step-N directory whose metadata records a step must record N (a
// checkpoint copied or renamed to another step's name would resume, or
// sample, the wrong step). A name that is not step-N, or metadata without a
// step (a plain checkpoint::save; the manager refuses those in its root),
// has nothing to disagree with. The manager and `generate` share it.
std::string step_name_disagreement(const std::string& path, const std::optional<int64_t>& recorded_step);
// Whether an entry of a root (a name, not a path) is the manager's: the run
// record, the lock, step directories and their leftovers. Anything else in a
// root is left alone, and may be read by a run (FileRoles).
bool is_managed_entry(const std::string& name);

// How a launch takes its root.
enum class RootMode {
  // A fresh run: the root must hold no checkpoint. It may be new, empty, or
  // hold the record of a launch that died before its first save (replaced).
  new_run,
  // Continue the root's run (resume): the record's identity must be this
  // launch's, except for the keys in ManagerOptions::may_change. A root
  // without checkpoints starts the run.
  continue_run,
};

struct ManagerOptions {
  dist::ProcessGroupPtr group = nullptr;  // the saving ranks; null: dist::world(), or this process alone
  int keep_last = 0;                      // after each commit delete all but this run's newest K; 0 keeps all
  bool sync = true;                       // fsync (off only for tests of speed)
  RootMode mode = RootMode::continue_run;
  nlohmann::json identity = nlohmann::json::object();  // what makes two launches the same run
  std::vector<std::string> may_change = {};  // identity keys a continue_run may change (recorded as amendments)
};

class CheckpointManager {
 public:
  // Collective over the group: rank 0 locks and inspects the root, claims it
  // (writes run.json) and removes leftovers of interrupted saves; every rank
  // checks that it can create files in it; any failure throws on every rank.
  CheckpointManager(std::string root, ManagerOptions options = {});
  ~CheckpointManager();  // waits for a pending async save (its error is printed, not thrown)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves `state` as checkpoint `step` and prunes; returns its path. Waits for
  // a pending async save first.
  std::string save(int64_t step, const checkpoint::DistributedStateDict& state, const nlohmann::json& training_state);
  // Snapshots now, writes in the background (then prunes); returns at once
  // after waiting for the previous async save.
  checkpoint::SaveHandle async_save(int64_t step, const checkpoint::DistributedStateDict& state, const nlohmann::json& training_state);
  // Waits for the pending async save, if any; rethrows its error.
  void wait();

  const std::string& root() const { return root_; }
  const std::string& run_id() const { return run_id_; }
  // What opening the root did or found that the user should hear (a run
  // started, leftovers removed, other files left alone, an amended identity,
  // an older damaged checkpoint): the same lines on every rank.
  const std::vector<std::string>& notices() const { return notices_; }
  // The newest of this run's checkpoints.
  std::optional<CheckpointEntry> latest() const;

 private:
  nlohmann::json open_root();  // rank 0: the verdict {run_id, notices} or {error}
  void prune(int64_t committed_step) const;
  checkpoint::SaveOptions save_options(int64_t step, const dist::ProcessGroupPtr& group, const nlohmann::json& training_state) const;

  std::string root_;
  ManagerOptions options_;
  std::string run_id_;
  std::vector<std::string> notices_;
  std::unique_ptr<RootLock> lock_;     // rank 0
  dist::ProcessGroupPtr group_;        // synchronous saves
  dist::ProcessGroupPtr async_group_;  // background saves: used by nothing else
  checkpoint::SaveHandle pending_;
  checkpoint::SnapshotBuffers snapshot_buffers_;  // reused by every async save: one copy of this rank's shards
};

}  // namespace tessera::train
