// Sharded save with an atomic commit, and resharding load by byte ranges.
#include "checkpoint/sharded_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"
#include "checkpoint/checksum.h"
#include "checkpoint/chunk_reader.h"
#include "checkpoint/file_io.h"
#include "checkpoint/host_pieces.h"
#include "checkpoint/metadata.h"
#include "checkpoint/rank_errors.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save_points.h"
#include "dist/launch/fault_injection.h"
#include "dist/process_group.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

// A rank's k-th file holds the k-th box of each of its pieces (a safetensors
// file holds one tensor of a name): a boxed piece of 3 boxes (GPT's fused qkv
// under tensor parallelism) takes 3 files.
std::string rank_file(int rank, size_t box) {
  return box == 0 ? fmt::format("rank-{:05d}.safetensors", rank) : fmt::format("rank-{:05d}-{}.safetensors", rank, box);
}

// The dtype an entry is saved in (its local tensor's).
DType dtype_of(const StateEntry& entry) {
  const std::vector<LocalBox> boxes = local_boxes_of(entry);
  TESSERA_CHECK(!boxes.empty() && boxes.front().local.defined(), "checkpoint: an entry holds no tensor");
  return boxes.front().local.dtype();
}

std::vector<uint32_t> block_checksums(const Tensor& dense) {
  std::vector<uint32_t> crcs;
  const auto* bytes = static_cast<const uint8_t*>(dense.nbytes() > 0 ? dense.raw_data() : nullptr);
  for (int64_t begin = 0; begin < dense.nbytes(); begin += kChecksumBlock) {
    crcs.push_back(crc32c(bytes + begin, static_cast<size_t>(std::min(kChecksumBlock, dense.nbytes() - begin))));
  }
  return crcs;
}

// An injected corruption (dist/launch/fault_injection.h): the file's last byte,
// which is tensor data, flips after its checksum was taken.
void flip_last_byte(const std::string& path) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(-1, std::ios::end);
  const char last = static_cast<char>(file.get() ^ 0x5a);
  file.seekp(-1, std::ios::end);
  file.put(last);
  TESSERA_CHECK(file.good(), "checkpoint::save: the injected corruption of '{}' failed", path);
}

// Writes this rank's files; returns each one's chunks as JSON.
nlohmann::json write_rank_files(const std::string& tmp, const DistributedStateDict& state, int rank, bool sync) {
  autograd::NoGradGuard no_grad;  // reads the values of tensors that may require grad (live parameters)
  // Device pieces come to the host first, through page-locked buffers (an
  // async save's snapshot is there already).
  const HostPieces host = stage_written_pieces(state, rank, false,
                                               [](const std::string&, const Tensor& like) { return new_host_buffer(like); });
  host.wait();
  std::vector<std::vector<std::pair<std::string, Tensor>>> tensors;  // by file
  std::vector<nlohmann::json> chunks;
  for (const auto& [name, entry] : host.state) {
    if (!writes_piece(entry, rank)) continue;
    const std::vector<LocalBox> boxes = local_boxes_of(entry);
    size_t written = 0;  // empty boxes take no file
    for (const LocalBox& box : boxes) {
      if (box.local.numel() == 0) continue;
      if (tensors.size() <= written) {
        tensors.emplace_back();
        chunks.push_back(nlohmann::json::object());
      }
      const Tensor dense = ops::contiguous(box.local);
      chunks[written][name] = {{"offsets", box.offsets}, {"sizes", dense.sizes()}, {"crc32c", block_checksums(dense)}};
      tensors[written].emplace_back(name, dense);
      ++written;
    }
  }
  nlohmann::json files = nlohmann::json::array();
  for (size_t index = 0; index < tensors.size(); ++index) {
    const std::string file = rank_file(rank, index);
    const SafetensorsHeader header = write_safetensors((fs::path(tmp) / file).string(), tensors[index], {}, sync);
    for (const auto& entry : header.entries) {
      chunks[index][entry.name]["byte_range"] = {header.data_offset + entry.begin, header.data_offset + entry.end};
    }
    files.push_back(nlohmann::json{{"file", file}, {"chunks", chunks[index]}});
  }
  return nlohmann::json{{"files", files}};
}

}  // namespace

// ---- save ----------------------------------------------------------------------------------------

void check_no_pending_sums(const DistributedStateDict& state, const char* op) {
  for (const auto& [name, entry] : state) {
    const auto* dtensor = std::get_if<dist::DTensor>(&entry);
    if (dtensor == nullptr) continue;
    for (size_t dim = 0; dim < dtensor->placements().size(); ++dim) {
      TESSERA_CHECK(!std::holds_alternative<dist::Partial>(dtensor->placements()[dim]),
                    "{}: '{}' is Partial(sum) on mesh dim {}: its pieces are terms of a pending sum, not the value; "
                    "redistribute it to Replicate or Shard first",
                    op, name, dim);
    }
  }
}

std::vector<LocalBox> local_boxes_of(const StateEntry& entry) {
  if (const Tensor* tensor = std::get_if<Tensor>(&entry)) {
    return {{*tensor, tensor->defined() ? Shape(static_cast<size_t>(tensor->dim()), 0) : Shape{}}};
  }
  if (const auto* boxed = std::get_if<BoxedPiece>(&entry)) return boxed->boxes;
  const dist::DTensor& dtensor = std::get<dist::DTensor>(entry);
  return {{dtensor.local(), dtensor.local_offset()}};
}

const Shape& global_shape_of(const StateEntry& entry) {
  if (const Tensor* tensor = std::get_if<Tensor>(&entry)) return tensor->sizes();
  if (const auto* boxed = std::get_if<BoxedPiece>(&entry)) return boxed->global_shape;
  return std::get<dist::DTensor>(entry).global_shape();
}

bool writes_piece(const StateEntry& entry, int rank) {
  if (const auto* boxed = std::get_if<BoxedPiece>(&entry)) return boxed->written;
  const auto* dtensor = std::get_if<dist::DTensor>(&entry);
  if (dtensor == nullptr) return rank == 0;
  bool owned = true;
  for (size_t dim = 0; dim < dtensor->placements().size(); ++dim) {
    if (std::holds_alternative<dist::Replicate>(dtensor->placements()[dim])) {
      owned = owned && dtensor->mesh().coordinate(static_cast<int64_t>(dim)) == 0;
    }
  }
  return owned;
}

void save(const std::string& dir, const DistributedStateDict& state, const SaveOptions& options) {
  save_or_report(dir, state, options, "");
}

void save_or_report(const std::string& dir, const DistributedStateDict& state, const SaveOptions& options,
                    const std::string& local_error) {
  check_no_pending_sums(state, "checkpoint::save");
  const dist::ProcessGroupPtr group = resolve_group(options.group);
  const int rank = rank_of(group);
  const std::string tmp = dir + ".tmp";

  // Rank 0 prepares the temporary directory; the others wait for its verdict.
  nlohmann::json prepared = nlohmann::json::object();
  if (rank == 0) {
    try {
      TESSERA_CHECK(!fs::exists(dir), "checkpoint::save: '{}' already exists; save to a new directory", dir);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    } catch (const std::exception& error) {
      prepared["error"] = error.what();
    }
  }
  rethrow_any(gather_json(group, prepared), "save");

  nlohmann::json mine;
  const int world_rank = group ? group->world_ranks()[static_cast<size_t>(rank)] : 0;
  try {
    if (!local_error.empty()) fail("{}", local_error);
    const std::optional<dist::Fault> fault = dist::fault_at(dist::FaultPoint::checkpoint_write, world_rank);
    if (fault && fault->action == dist::FaultAction::fail) {
      fail("checkpoint::save: writing {} in '{}' failed: {} (injected fault {})", rank_file(rank, 0), tmp,
           dist::describe_errno(fault->error_number), fault->to_string());
    }
    mine = write_rank_files(tmp, state, rank, options.sync);
    if (fault && fault->action == dist::FaultAction::corrupt && !mine["files"].empty()) {
      flip_last_byte((fs::path(tmp) / mine["files"][0]["file"].get<std::string>()).string());
    }
  } catch (const std::exception& error) {
    mine = {{"error", error.what()}};
  }
  reach_save_point("rank_file_written");
  const std::vector<nlohmann::json> reports = gather_json(group, mine);
  // A failed save (a full disk, say) takes its partial directory with it:
  // the previous checkpoints stay, and the space it held is free again.
  const auto discard_partial = [&](const std::vector<nlohmann::json>& outcomes) {
    const bool failed = std::any_of(outcomes.begin(), outcomes.end(),
                                    [](const nlohmann::json& outcome) { return outcome.contains("error"); });
    if (failed && rank == 0) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
    }
    rethrow_any(outcomes, "save");
  };
  discard_partial(reports);

  nlohmann::json committed = nlohmann::json::object();
  if (rank == 0) {
    try {
      CheckpointMetadata metadata;
      metadata.step = options.step;
      metadata.run_id = options.run_id;
      metadata.training_state = options.training_state;
      for (const auto& [name, entry] : state) {
        metadata.tensors[name] = TensorInfo{dtype_of(entry), global_shape_of(entry), {}};
      }
      for (const auto& report : reports) {
        for (const auto& written : report["files"]) {
          for (const auto& [name, chunk] : written["chunks"].items()) {
            TESSERA_CHECK(metadata.tensors.count(name) == 1, "checkpoint::save: '{}' is not in rank 0's state dict",
                          name);
            metadata.tensors[name].chunks.push_back(
                ChunkInfo{written["file"].get<std::string>(), chunk["byte_range"][0].get<int64_t>(),
                          chunk["byte_range"][1].get<int64_t>(), chunk["offsets"].get<Shape>(),
                          chunk["sizes"].get<Shape>(), chunk["crc32c"].get<std::vector<uint32_t>>()});
          }
        }
      }
      const std::string text = metadata.to_json_text();
      CheckpointMetadata::parse(text, "checkpoint::save");  // every chunk accounted for
      WriteFile file((fs::path(tmp) / kMetadataFile).string());
      file.write(text.data(), static_cast<int64_t>(text.size()));
      file.close(options.sync);
      if (options.sync) sync_directory(tmp);
      reach_save_point("metadata_written");
      if (const std::optional<dist::Fault> fault = dist::fault_at(dist::FaultPoint::checkpoint_commit, world_rank)) {
        dist::carry_out(*fault, fmt::format("the commit of '{}'", dir), group && group->backend_name() != "local");
      }
      fs::rename(tmp, dir);
      if (options.sync) sync_directory(fs::absolute(dir).parent_path().string());
      reach_save_point("committed");
    } catch (const std::exception& error) {
      committed["error"] = error.what();
    }
  }
  discard_partial(gather_json(group, committed));
}

// ---- load ----------------------------------------------------------------------------------------

CheckpointMetadata read_metadata(const std::string& dir) {
  const std::string metadata_path = (fs::path(dir) / kMetadataFile).string();
  TESSERA_CHECK(fs::is_directory(dir), "checkpoint::load: '{}' is not a directory", dir);
  TESSERA_CHECK(fs::exists(metadata_path), "checkpoint::load: '{}' has no {} (not a checkpoint, or an unfinished save)",
                dir, kMetadataFile);
  return CheckpointMetadata::parse(read_file_text(metadata_path), metadata_path);
}

LoadReport load(const std::string& dir, const DistributedStateDict& state, const LoadOptions& options) {
  check_no_pending_sums(state, "checkpoint::load");
  const CheckpointMetadata metadata = read_metadata(dir);

  LoadReport report;
  report.training_state = metadata.training_state;
  std::vector<std::string> problems;
  for (const auto& [name, entry] : state) {
    const auto found = metadata.tensors.find(name);
    if (found == metadata.tensors.end()) {
      report.missing_keys.push_back(name);
      continue;
    }
    if (found->second.global_shape != global_shape_of(entry)) {
      problems.push_back(fmt::format("{}: shape {} in the checkpoint, {} here", name, found->second.global_shape,
                                     global_shape_of(entry)));
    }
    const Tensor local = local_boxes_of(entry).front().local;
    if (local.defined() && !loads_into(found->second.dtype, local.dtype())) {
      problems.push_back(fmt::format("{}: dtype {} in the checkpoint, {} here (only a float loads into a float; an "
                                     "integer or bool only into its own dtype)",
                                     name, dtype_name(found->second.dtype), dtype_name(local.dtype())));
    }
  }
  for (const auto& [name, info] : metadata.tensors) {
    if (state.count(name) == 0) report.unexpected_keys.push_back(name);
  }
  if (options.strict) {
    if (!report.missing_keys.empty()) problems.push_back(fmt::format("missing keys: {}", fmt::join(report.missing_keys, ", ")));
    if (!report.unexpected_keys.empty()) {
      problems.push_back(fmt::format("unexpected keys: {}", fmt::join(report.unexpected_keys, ", ")));
    }
  }
  TESSERA_CHECK(problems.empty(), "checkpoint::load: {} does not fit the state dict: {}", dir, fmt::join(problems, "; "));

  // The header of every rank file this rank reads from, before any of its data.
  std::set<std::string> files_read;
  for (const auto& [name, entry] : state) {
    const auto found = metadata.tensors.find(name);
    if (found == metadata.tensors.end()) continue;
    for (const LocalBox& box : local_boxes_of(entry)) {
      if (!box.local.defined()) continue;
      for (const ChunkInfo& chunk : found->second.chunks) {
        if (chunk_overlaps(chunk, box.offsets, box.local.sizes())) files_read.insert(chunk.file);
      }
    }
  }
  for (const std::string& file : files_read) {
    const std::string path = (fs::path(dir) / file).string();
    metadata.check_rank_file_header(file, read_safetensors_header(path), path);
  }

  for (const auto& [name, entry] : state) {
    const auto found = metadata.tensors.find(name);
    if (found == metadata.tensors.end()) continue;
    for (LocalBox& box : local_boxes_of(entry)) {
      read_chunks(dir, found->second.chunks, found->second.dtype, name, box.local, box.offsets);
    }
  }
  return report;
}

}  // namespace tessera::checkpoint
