// Checkpoint and export sizes from the model on meta, and the statvfs check.
#include "train/disk_space.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/metadata.h"
#include "dist/comm_stats.h"
#include "tensor/error.h"
#include "train/file_roles.h"
#include "train/model_family.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// Generous bounds on the text around the tensor bytes: a safetensors header
// entry or a metadata.json chunk record of one tensor, beyond its name; the
// training state's JSON (config, schedule) and each rank's RNG state in it.
constexpr int64_t kHeaderEntryBytes = 128;
constexpr int64_t kMetadataChunkBytes = 256;
constexpr int64_t kChecksumTextBytes = 12;  // one CRC-32C in the metadata's JSON
constexpr int64_t kTrainingStateBytes = 16 << 10;
constexpr int64_t kRngStateBytes = 512;
// A filesystem rounds every file up to its blocks (4 KiB on ext4, xfs, tmpfs).
constexpr int64_t kBlockBytes = 4096;

int64_t round_to_blocks(int64_t bytes) { return (bytes + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }

struct ParameterSizes {
  int64_t count = 0;
  int64_t bytes = 0;
  int64_t name_bytes = 0;
};

ParameterSizes parameter_sizes(const TrainConfig& config) {
  ParameterSizes sizes;
  for (const auto& [name, parameter] : build_model(config.model_config(), tessera::kMeta)->named_parameters()) {
    ++sizes.count;
    sizes.bytes += parameter->tensor().numel() * static_cast<int64_t>(tessera::element_size(parameter->tensor().dtype()));
    sizes.name_bytes += static_cast<int64_t>(name.size()) + 16;  // "model." / "optim." and ".exp_avg_sq"
  }
  return sizes;
}

}  // namespace

int64_t checkpoint_bytes_bound(const TrainConfig& config) {
  const ParameterSizes sizes = parameter_sizes(config);
  const int64_t ranks = config.nproc;
  const int64_t entries = 4 * sizes.count;  // the parameter, exp_avg, exp_avg_sq, step
  const int64_t data = 3 * sizes.bytes + 8 * sizes.count;
  const int64_t headers = ranks * (4 * sizes.name_bytes + entries * kHeaderEntryBytes);
  const int64_t checksums = (data / tessera::checkpoint::kChecksumBlock + entries * ranks) * kChecksumTextBytes;
  const int64_t metadata = 4 * sizes.name_bytes + entries * ranks * kMetadataChunkBytes + checksums +
                           kTrainingStateBytes + ranks * kRngStateBytes;
  // Each rank's file and metadata.json round up to blocks, and the directory takes one.
  return round_to_blocks(data + headers) + (ranks + 1) * kBlockBytes + round_to_blocks(metadata) + kBlockBytes;
}

int64_t export_bytes_bound(const TrainConfig& config) {
  const ParameterSizes sizes = parameter_sizes(config);
  return round_to_blocks(sizes.bytes + sizes.name_bytes + sizes.count * kHeaderEntryBytes + kTrainingStateBytes);
}

int64_t checkpoints_saved(const TrainConfig& config, int64_t resume_step) {
  if (config.ckpt_dir.empty() || resume_step >= config.steps) return 0;
  const int64_t every = config.ckpt_every;
  const int64_t periodic = every > 0 ? config.steps / every - resume_step / every : 0;
  const bool last_is_periodic = every > 0 && config.steps % every == 0;
  return periodic + (last_is_periodic ? 0 : 1);
}

int64_t checkpoints_added_at_peak(const TrainConfig& config, int64_t resume_step, int64_t existing) {
  const int64_t saved = checkpoints_saved(config, resume_step);
  if (saved == 0) return 0;
  if (config.keep == 0) return saved;
  // The first save holds existing + 1; later ones grow the count to keep + 1.
  return std::max<int64_t>(1, std::min<int64_t>(saved, config.keep + 1 - existing));
}

std::optional<FilesystemSpace> filesystem_space(const std::string& path) {
  fs::path probe = resolve_path(path);
  struct stat info {};
  while (::stat(probe.c_str(), &info) != 0) {
    if (probe == probe.parent_path()) return std::nullopt;
    probe = probe.parent_path();
  }
  struct statvfs space {};
  if (::statvfs(probe.c_str(), &space) != 0) return std::nullopt;
  return FilesystemSpace{static_cast<uint64_t>(info.st_dev),
                         static_cast<int64_t>(space.f_bavail) * static_cast<int64_t>(space.f_frsize)};
}

void check_disk_space(const TrainConfig& config, int64_t resume_step, int64_t existing_checkpoints,
                      const FreeSpaceLookup& lookup) {
  struct Need {
    std::string flag;
    std::string path;
    int64_t bytes;
    std::string what;
  };
  std::vector<Need> needs;
  const int64_t checkpoints = checkpoints_added_at_peak(config, resume_step, existing_checkpoints);
  if (checkpoints > 0) {
    const int64_t each = checkpoint_bytes_bound(config);
    const std::string kept =
        config.keep == 0 ? "all kept (--keep 0)" : fmt::format("--keep {} plus the one being saved", config.keep);
    needs.push_back({"--ckpt-dir", config.ckpt_dir, each * checkpoints,
                     fmt::format("{} checkpoint{} of up to {} at once ({})", checkpoints, checkpoints == 1 ? "" : "s",
                                 tessera::dist::human_bytes(each), kept)});
  }
  if (!config.export_path.empty()) {
    needs.push_back({"--export", config.export_path, export_bytes_bound(config), "the exported model"});
  }
  std::map<uint64_t, std::pair<FilesystemSpace, std::vector<const Need*>>> by_filesystem;
  for (const Need& need : needs) {
    const std::optional<FilesystemSpace> space = lookup(need.path);
    if (!space) continue;  // unreadable: the writes themselves will say
    auto& [filesystem, sharing] = by_filesystem.try_emplace(space->device, *space, std::vector<const Need*>{}).first->second;
    sharing.push_back(&need);
  }
  for (const auto& [device, entry] : by_filesystem) {
    const auto& [space, sharing] = entry;
    int64_t total = 0;
    std::vector<std::string> parts;
    for (const Need* need : sharing) {
      total += need->bytes;
      parts.push_back(fmt::format("{} {}: {}, {}", need->flag, need->path, need->what,
                                  tessera::dist::human_bytes(need->bytes)));
    }
    TESSERA_CHECK(total <= space.free_bytes,
                  "not enough disk space: {} ({} in all) on a filesystem with {} free; free space, keep fewer "
                  "checkpoints (--keep), or choose another directory",
                  fmt::join(parts, "; "), tessera::dist::human_bytes(total), tessera::dist::human_bytes(space.free_bytes));
  }
}

}  // namespace tessera::train
