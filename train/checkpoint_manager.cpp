// A run's checkpoints under one root: ownership, naming, latest, keep-last-K, async.
#include "train/checkpoint_manager.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>

#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "checkpoint/rank_errors.h"
#include "checkpoint/save_points.h"
#include "train/root_lock.h"
#include "train/run_record.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kStepPrefix = "step-";
constexpr const char* kDeletingSuffix = ".deleting";
constexpr const char* kTmpSuffix = ".tmp";

// N for a name of exactly step-N; nullopt for anything else (.tmp, .deleting).
std::optional<int64_t> step_of(const std::string& name) {
  if (name.size() <= kStepPrefix.size() || name.compare(0, kStepPrefix.size(), kStepPrefix) != 0) return std::nullopt;
  int64_t step = 0;
  const char* begin = name.data() + kStepPrefix.size();
  const char* end = name.data() + name.size();
  const auto [stop, error] = std::from_chars(begin, end, step);
  if (error != std::errc() || stop != end || step < 0) return std::nullopt;
  return step;
}

std::vector<int> all_ranks(const dist::ProcessGroupPtr& group) {
  std::vector<int> ranks(static_cast<size_t>(group->size()));
  for (int rank = 0; rank < group->size(); ++rank) ranks[static_cast<size_t>(rank)] = rank;
  return ranks;
}

// A step-N directory that holds metadata.json: whose it is, or why it cannot be read.
struct FoundCheckpoint {
  int64_t step = 0;
  std::string path;
  std::string run_id;
  std::string damage;  // non-empty: the metadata is unreadable or contradicts the name
};

// Everything in a root, sorted into what the manager does with it.
struct RootContents {
  std::vector<FoundCheckpoint> checkpoints;  // oldest first
  std::vector<std::string> torn;             // step-N without metadata.json
  std::vector<std::string> not_directories;  // step-N that is a file or a symbolic link (dangling ones too)
  std::vector<std::string> leftovers;        // step-N.tmp, step-N.deleting: interrupted saves and prunes
  std::optional<std::string> record_leftover;  // run.json.tmp: a launch died while claiming the root
  std::vector<std::string> others;           // not the manager's
  bool has_record = false;
};

FoundCheckpoint inspect_checkpoint(int64_t step, const std::string& path) {
  FoundCheckpoint found{step, path, "", ""};
  try {
    const checkpoint::CheckpointMetadata metadata = checkpoint::read_metadata(path);
    found.run_id = metadata.run_id;
    // Every save of a manager records its step.
    found.damage = metadata.step ? step_name_disagreement(path, metadata.step)
                                 : fmt::format("its metadata records no step, its name step {}", step);
  } catch (const std::exception& error) {
    found.damage = error.what();
  }
  return found;
}

RootContents scan_root(const std::string& root) {
  RootContents contents;
  for (const fs::directory_entry& child : fs::directory_iterator(root)) {
    const std::string name = child.path().filename().string();
    if (name == kRunRecordFile) {
      contents.has_record = true;
    } else if (name == kRootLockFile || name.starts_with(".rank-")) {
      continue;
    } else if (name == std::string(kRunRecordFile) + kTmpSuffix) {
      contents.record_leftover = child.path().string();
    } else if (name.starts_with(kStepPrefix) && (name.ends_with(kTmpSuffix) || name.ends_with(kDeletingSuffix))) {
      contents.leftovers.push_back(child.path().string());
    } else if (const std::optional<int64_t> step = step_of(name); step && !child.is_directory()) {
      contents.not_directories.push_back(child.path().string());
    } else if (step) {
      if (child.is_symlink()) {
        contents.not_directories.push_back(child.path().string());
      } else if (fs::exists(child.path() / checkpoint::kMetadataFile)) {
        contents.checkpoints.push_back(inspect_checkpoint(*step, child.path().string()));
      } else {
        contents.torn.push_back(child.path().string());
      }
    } else {
      contents.others.push_back(name);
    }
  }
  std::sort(contents.checkpoints.begin(), contents.checkpoints.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  std::sort(contents.torn.begin(), contents.torn.end());
  std::sort(contents.not_directories.begin(), contents.not_directories.end());
  std::sort(contents.others.begin(), contents.others.end());
  return contents;
}

std::string names_of(const std::vector<FoundCheckpoint>& checkpoints) {
  std::vector<std::string> paths;
  for (const FoundCheckpoint& found : checkpoints) paths.push_back(found.path);
  return fmt::format("{}", fmt::join(paths, ", "));
}

// Creating a file is what every rank does in a save; a root mounted read-only
// on one node, or owned by another user, is found here rather than at step N.
void probe_writable(const std::string& root, int rank) {
  checkpoint::check_can_create((fs::path(root) / fmt::format(".rank-{}", rank)).string());
}

}  // namespace

bool is_managed_entry(const std::string& name) {
  return name == kRunRecordFile || name == std::string(kRunRecordFile) + kTmpSuffix || name == kRootLockFile ||
         name.starts_with(".rank-") || name.starts_with(kStepPrefix);
}

std::string checkpoint_path(const std::string& root, int64_t step) {
  TESSERA_CHECK(step >= 0, "checkpoint_path: step must be >= 0, got {}", step);
  return (fs::path(root) / fmt::format("{}{:08d}", kStepPrefix, step)).string();
}

std::string step_name_disagreement(const std::string& path, const std::optional<int64_t>& recorded_step) {
  fs::path name(path);
  if (!name.has_filename()) name = name.parent_path();  // "step-00000004/"
  const std::optional<int64_t> named_step = step_of(name.filename().string());
  if (!named_step || !recorded_step || recorded_step == named_step) return {};
  return fmt::format("its metadata says step {}, its name step {}", *recorded_step, *named_step);
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> entries;
  std::error_code error;
  if (!fs::is_directory(root, error)) return entries;
  for (const fs::directory_entry& child : fs::directory_iterator(root)) {
    const std::optional<int64_t> step = step_of(child.path().filename().string());
    if (step && child.is_directory() && fs::exists(child.path() / checkpoint::kMetadataFile)) {
      entries.push_back({*step, child.path().string()});
    }
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return entries;
}

std::optional<CheckpointEntry> latest_checkpoint(const std::string& root) {
  std::vector<CheckpointEntry> entries = list_checkpoints(root);
  if (entries.empty()) return std::nullopt;
  return entries.back();
}

// ---- opening a root ------------------------------------------------------------------------------

CheckpointManager::CheckpointManager(std::string root, ManagerOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  TESSERA_CHECK(!root_.empty(), "CheckpointManager: the root directory is empty");
  TESSERA_CHECK(options_.keep_last >= 0, "CheckpointManager: keep_last must be >= 0 (0 keeps all), got {}",
                options_.keep_last);
  TESSERA_CHECK(options_.identity.is_object(), "CheckpointManager: the identity must be a JSON object, got {}",
                options_.identity.dump());
  group_ = checkpoint::resolve_group(options_.group);
  if (group_) async_group_ = group_->split(all_ranks(group_), "checkpoint");
  const int rank = checkpoint::rank_of(group_);
  const nlohmann::json verdict = rank == 0 ? open_root() : nlohmann::json::object();
  const std::vector<nlohmann::json> verdicts = checkpoint::gather_json(group_, verdict);
  checkpoint::rethrow_any(verdicts, "open");
  run_id_ = verdicts[0]["run_id"].get<std::string>();
  notices_ = verdicts[0]["notices"].get<std::vector<std::string>>();
  checkpoint::rethrow_any(checkpoint::gather_json(group_, checkpoint::report_of([&] { probe_writable(root_, rank); })), "open");
}

namespace {

// The root's run record: a new one when the root has none (and no step
// directories either), else the recorded one, whose identity must be this
// launch's but for the keys a continue_run may change.
RunRecord claim_record(const std::string& root, const RootContents& contents, const ManagerOptions& options,
                       std::vector<std::string>& notices) {
  const std::string record_path = (fs::path(root) / kRunRecordFile).string();
  const bool holds_steps = !contents.checkpoints.empty() || !contents.torn.empty() || !contents.leftovers.empty();
  std::optional<RunRecord> recorded;
  try {
    if (contents.has_record) recorded = RunRecord::read(record_path);
  } catch (const tessera::Error& error) {
    // The record names the run its checkpoints belong to; with none in the
    // root, nothing depends on it.
    TESSERA_CHECK(holds_steps, "{}\n{} holds no checkpoint, so nothing depends on its {}: it only says which run "
                  "claimed the root, and that run saved nothing. Delete the file and launch again (this launch "
                  "then claims the root), or choose another root.",
                  error.what(), root, kRunRecordFile);
    throw;
  }
  if (!recorded || !holds_steps) {
    TESSERA_CHECK(!holds_steps,
                  "{} holds checkpoint directories but no {} saying which run wrote them (an older tessera, or "
                  "copied in); tessera will not save, prune or resume among them: move them away or choose another "
                  "root",
                  root, kRunRecordFile);
    // A record without a single step directory protects nothing: the launch
    // that wrote it died before its first save.
    RunRecord record = RunRecord::start(options.identity);
    record.write(record_path, options.sync);
    notices.push_back(recorded ? fmt::format("{}: started run {} (run {} saved no checkpoint here)", root,
                                             record.run_id, recorded->run_id)
                               : fmt::format("{}: started run {}", root, record.run_id));
    return record;
  }
  RunRecord record = std::move(*recorded);
  std::vector<std::string> refused;
  for (const IdentityDifference& difference : identity_differences(record.identity, options.identity)) {
    const bool allowed =
        options.mode == RootMode::continue_run &&
        std::find(options.may_change.begin(), options.may_change.end(), difference.key) != options.may_change.end();
    if (!allowed) refused.push_back(difference.description);
  }
  TESSERA_CHECK(refused.empty(), "{} belongs to run {} (started {}), not to this launch: {}; choose another root", root,
                record.run_id, record.created, fmt::join(refused, "; "));
  return record;
}

// What the step directories may hold for this launch: only the record's
// run's complete checkpoints (none for a new run), the newest one intact.
void check_checkpoints(const std::string& root, const RootContents& contents, const RunRecord& record, RootMode mode,
                       std::vector<std::string>& notices) {
  std::vector<FoundCheckpoint> foreign;
  for (const FoundCheckpoint& found : contents.checkpoints) {
    if (found.damage.empty() && found.run_id != record.run_id) foreign.push_back(found);
  }
  TESSERA_CHECK(foreign.empty(), "{} holds checkpoints of another run (copied in?): {}; move them away", root,
                names_of(foreign));
  TESSERA_CHECK(contents.not_directories.empty(),
                "{} holds entries named like checkpoints that are not directories (a file, or a symbolic link): {}; "
                "tessera saves checkpoints under these names, so move them away",
                root, fmt::join(contents.not_directories, ", "));
  TESSERA_CHECK(contents.torn.empty(),
                "{} holds step directories without {} (tessera commits a checkpoint by renaming it whole, so these "
                "were copied or edited): {}; move them away",
                root, checkpoint::kMetadataFile, fmt::join(contents.torn, ", "));
  if (mode == RootMode::new_run) {
    TESSERA_CHECK(contents.checkpoints.empty(),
                  "{} already holds this run's checkpoints ({}); resume from the newest, or choose another root", root,
                  names_of(contents.checkpoints));
  }
  if (contents.checkpoints.empty()) return;
  const FoundCheckpoint& newest = contents.checkpoints.back();
  TESSERA_CHECK(newest.damage.empty(),
                "the newest checkpoint {} is damaged: {}; move it away to resume from the one before", newest.path,
                newest.damage);
  for (const FoundCheckpoint& found : contents.checkpoints) {
    if (!found.damage.empty()) {
      notices.push_back(fmt::format("{} is damaged ({}); it is kept and never loaded", found.path, found.damage));
    }
  }
}

// Writes the permitted identity changes into the record, each an amendment
// at the newest checkpoint's step.
void amend_identity(const std::string& root, const RootContents& contents, RunRecord& record,
                    const nlohmann::json& identity, bool sync, std::vector<std::string>& notices) {
  const std::vector<IdentityDifference> changes = identity_differences(record.identity, identity);
  if (changes.empty()) return;
  const int64_t at_step = contents.checkpoints.empty() ? 0 : contents.checkpoints.back().step;
  std::vector<std::string> described;
  for (const IdentityDifference& change : changes) {
    const auto value_in = [&](const nlohmann::json& json) {
      return json.contains(change.key) ? json[change.key] : nlohmann::json(nullptr);
    };
    record.amendments.push_back(
        {{"at_step", at_step}, {"key", change.key}, {"from", value_in(record.identity)}, {"to", value_in(identity)}});
    described.push_back(change.description);
  }
  record.identity = identity;
  const std::string record_path = (fs::path(root) / kRunRecordFile).string();
  record.write(record_path, sync);
  notices.push_back(fmt::format("{}: identity amended at step {}: {}", record_path, at_step, fmt::join(described, "; ")));
}

}  // namespace

nlohmann::json CheckpointManager::open_root() {
  std::vector<std::string> notices;
  const nlohmann::json outcome = checkpoint::report_of([&] {
    fs::create_directories(root_);
    TESSERA_CHECK(fs::is_directory(root_), "{}: not a directory", root_);
    lock_ = std::make_unique<RootLock>(root_);
    const RootContents contents = scan_root(root_);
    // Under the lock nobody else writes it: a launch died while claiming the root.
    if (contents.record_leftover) {
      fs::remove_all(*contents.record_leftover);
      notices.push_back(fmt::format("removed {} (a launch that died while claiming the root)", *contents.record_leftover));
    }
    RunRecord record = claim_record(root_, contents, options_, notices);
    check_checkpoints(root_, contents, record, options_.mode, notices);
    amend_identity(root_, contents, record, options_.identity, options_.sync, notices);
    for (const std::string& leftover : contents.leftovers) {
      fs::remove_all(leftover);
      notices.push_back(fmt::format("removed {} (an interrupted save or prune)", leftover));
    }

    if (!contents.others.empty()) {
      notices.push_back(fmt::format("{} also holds {} (not checkpoints; left alone)", root_,
                                    fmt::join(contents.others, ", ")));
    }
    run_id_ = record.run_id;
  });
  if (outcome.contains("error")) return outcome;
  return {{"run_id", run_id_}, {"notices", notices}};
}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const std::exception& error) {
    std::cerr << "CheckpointManager: the last async save failed: " << error.what() << '\n';
  }
}

std::optional<CheckpointEntry> CheckpointManager::latest() const {
  const RootContents contents = scan_root(root_);
  for (auto found = contents.checkpoints.rbegin(); found != contents.checkpoints.rend(); ++found) {
    if (found->damage.empty() && found->run_id == run_id_) return CheckpointEntry{found->step, found->path};
  }
  return std::nullopt;
}

// ---- saving and pruning --------------------------------------------------------------------------

checkpoint::SaveOptions CheckpointManager::save_options(int64_t step, const dist::ProcessGroupPtr& group,
                                            const nlohmann::json& training_state) const {
  return {.group = group, .training_state = training_state, .step = step, .run_id = run_id_, .sync = options_.sync};
}

std::string CheckpointManager::save(int64_t step, const checkpoint::DistributedStateDict& state,
                                    const nlohmann::json& training_state) {
  wait();
  const std::string path = checkpoint_path(root_, step);
  checkpoint::save(path, state, save_options(step, group_, training_state));
  if (checkpoint::rank_of(group_) == 0) prune(step);
  return path;
}

checkpoint::SaveHandle CheckpointManager::async_save(int64_t step, const checkpoint::DistributedStateDict& state,
                                         const nlohmann::json& training_state) {
  wait();
  const bool prunes = checkpoint::rank_of(group_) == 0;
  pending_ = checkpoint::async_save(checkpoint_path(root_, step), state, save_options(step, async_group_, training_state),
                                    [this, prunes, step] {
                                      if (prunes) prune(step);
                                    },
                                    &snapshot_buffers_);
  return pending_;
}

void CheckpointManager::wait() {
  checkpoint::SaveHandle pending = std::move(pending_);
  pending_ = checkpoint::SaveHandle();
  pending.wait();
}

// Keeps the checkpoint just committed and this run's newest keep_last - 1
// before it. Anything else (another run's, a damaged one, a newer step) is
// not this manager's to delete.
void CheckpointManager::prune(int64_t committed_step) const {
  if (options_.keep_last == 0) return;
  std::vector<FoundCheckpoint> older;
  for (const FoundCheckpoint& found : scan_root(root_).checkpoints) {
    if (found.damage.empty() && found.run_id == run_id_ && found.step < committed_step) older.push_back(found);
  }
  const size_t keep_older = static_cast<size_t>(options_.keep_last - 1);
  const size_t excess = older.size() > keep_older ? older.size() - keep_older : 0;
  for (size_t index = 0; index < excess; ++index) {
    // Renamed aside first, so a crash mid-delete leaves no step-N directory
    // with half its files.
    const std::string aside = older[index].path + kDeletingSuffix;
    fs::rename(older[index].path, aside);
    if (options_.sync) checkpoint::sync_directory(root_);
    checkpoint::reach_save_point("pruning");
    fs::remove_all(aside);
  }
}

}  // namespace tessera::train
