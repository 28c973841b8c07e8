// A run's checkpoints under one root: naming, latest, keep-last-K, async.
#include "checkpoint/checkpoint_manager.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>

#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "checkpoint/rank_errors.h"
#include "checkpoint/save_points.h"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kStepPrefix = "step-";
constexpr const char* kDeletingSuffix = ".deleting";

// N for a directory named exactly step-N; nullopt for anything else (.tmp, .deleting).
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

}  // namespace

std::string checkpoint_path(const std::string& root, int64_t step) {
  TESSERA_CHECK(step >= 0, "checkpoint_path: step must be >= 0, got {}", step);
  return (fs::path(root) / fmt::format("{}{:08d}", kStepPrefix, step)).string();
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> entries;
  std::error_code error;
  if (!fs::is_directory(root, error)) return entries;
  for (const fs::directory_entry& child : fs::directory_iterator(root)) {
    const std::optional<int64_t> step = step_of(child.path().filename().string());
    if (step && child.is_directory() && fs::exists(child.path() / kMetadataFile)) {
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

CheckpointManager::CheckpointManager(std::string root, ManagerOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  TESSERA_CHECK(!root_.empty(), "CheckpointManager: the root directory is empty");
  TESSERA_CHECK(options_.keep_last >= 0, "CheckpointManager: keep_last must be >= 0 (0 keeps all), got {}",
                options_.keep_last);
  group_ = resolve_group(options_.group);
  if (group_) async_group_ = group_->split(all_ranks(group_), "checkpoint");
  nlohmann::json prepared = nlohmann::json::object();
  if (rank_of(group_) == 0) {
    prepared = report_of([this] {
      // Leftovers of a run that died mid-save or mid-prune; no save of this
      // root is in flight while its manager is being built.
      fs::create_directories(root_);
      for (const fs::directory_entry& child : fs::directory_iterator(root_)) {
        const std::string name = child.path().filename().string();
        const bool unfinished = name.ends_with(".tmp") || name.ends_with(kDeletingSuffix);
        if (unfinished && name.starts_with(kStepPrefix)) fs::remove_all(child.path());
      }
    });
  }
  rethrow_any(gather_json(group_, prepared), "CheckpointManager");
}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const std::exception& error) {
    std::cerr << "CheckpointManager: the last async save failed: " << error.what() << '\n';
  }
}

std::string CheckpointManager::save(int64_t step, const DistributedStateDict& state,
                                    const nlohmann::json& training_state) {
  wait();
  const std::string path = checkpoint_path(root_, step);
  checkpoint::save(path, state, {.group = group_, .training_state = training_state, .sync = options_.sync});
  prune(rank_of(group_));
  return path;
}

SaveHandle CheckpointManager::async_save(int64_t step, const DistributedStateDict& state,
                                         const nlohmann::json& training_state) {
  wait();
  const int rank = rank_of(group_);
  pending_ = checkpoint::async_save(checkpoint_path(root_, step), state,
                                    {.group = async_group_, .training_state = training_state, .sync = options_.sync},
                                    [this, rank] { prune(rank); }, &snapshot_buffers_);
  return pending_;
}

void CheckpointManager::wait() {
  SaveHandle pending = std::move(pending_);
  pending_ = SaveHandle();
  pending.wait();
}

void CheckpointManager::prune(int rank) const {
  if (rank != 0 || options_.keep_last == 0) return;
  const std::vector<CheckpointEntry> entries = list_checkpoints(root_);
  const size_t excess = entries.size() > static_cast<size_t>(options_.keep_last)
                            ? entries.size() - static_cast<size_t>(options_.keep_last)
                            : 0;
  for (size_t index = 0; index < excess; ++index) {
    // Renamed aside first, so a crash mid-delete leaves no step-N directory
    // with half its files.
    const std::string aside = entries[index].path + kDeletingSuffix;
    fs::rename(entries[index].path, aside);
    if (options_.sync) sync_directory(root_);
    reach_save_point("pruning");
    fs::remove_all(aside);
  }
}

}  // namespace tessera::checkpoint
