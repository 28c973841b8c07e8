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

std::string rank_file(int rank) { return fmt::format("rank-{:05d}.safetensors", rank); }

// This rank's piece of an entry: the local tensor, where it sits, and whether
// this rank writes it (replicated data is written by one rank only).
struct Piece {
  Tensor local;
  Shape offsets;
  bool owned = false;
};

Piece piece_of(const StateEntry& entry, int rank) {
  const LocalBox box = local_box_of(entry);
  return {box.local, box.offsets, writes_piece(entry, rank)};
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

// Writes this rank's file; returns its chunks as JSON (or the error text).
nlohmann::json write_rank_file(const std::string& tmp, const DistributedStateDict& state, int rank, bool sync) {
  autograd::NoGradGuard no_grad;  // reads the values of tensors that may require grad (live parameters)
  // Device pieces come to the host first, through page-locked buffers (an
  // async save's snapshot is there already).
  const HostPieces host = stage_written_pieces(state, rank, false,
                                               [](const std::string&, const Tensor& like) { return new_host_buffer(like); });
  host.wait();
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::json chunks = nlohmann::json::object();
  for (const auto& [name, entry] : host.state) {
    Piece piece = piece_of(entry, rank);
    if (!piece.owned || piece.local.numel() == 0) continue;
    const Tensor dense = ops::contiguous(piece.local);
    chunks[name] = {{"offsets", piece.offsets}, {"sizes", dense.sizes()}, {"crc32c", block_checksums(dense)}};
    tensors.emplace_back(name, dense);
  }
  if (tensors.empty()) return nlohmann::json{{"file", nullptr}, {"chunks", chunks}};
  const std::string file = rank_file(rank);
  const SafetensorsHeader header = write_safetensors((fs::path(tmp) / file).string(), tensors, {}, sync);
  for (const auto& entry : header.entries) {
    chunks[entry.name]["byte_range"] = {header.data_offset + entry.begin, header.data_offset + entry.end};
  }
  return nlohmann::json{{"file", file}, {"chunks", chunks}};
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

LocalBox local_box_of(const StateEntry& entry) {
  if (const Tensor* tensor = std::get_if<Tensor>(&entry)) {
    return {*tensor, tensor->defined() ? Shape(static_cast<size_t>(tensor->dim()), 0) : Shape{}};
  }
  const dist::DTensor& dtensor = std::get<dist::DTensor>(entry);
  return {dtensor.local(), dtensor.local_offset()};
}

const Shape& global_shape_of(const StateEntry& entry) {
  if (const Tensor* tensor = std::get_if<Tensor>(&entry)) return tensor->sizes();
  return std::get<dist::DTensor>(entry).global_shape();
}

bool writes_piece(const StateEntry& entry, int rank) {
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
      fail("checkpoint::save: writing {} in '{}' failed: {} (injected fault {})", rank_file(rank), tmp,
           dist::describe_errno(fault->error_number), fault->to_string());
    }
    mine = write_rank_file(tmp, state, rank, options.sync);
    if (fault && fault->action == dist::FaultAction::corrupt && !mine["file"].is_null()) {
      flip_last_byte((fs::path(tmp) / mine["file"].get<std::string>()).string());
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
        const Piece piece = piece_of(entry, rank);
        metadata.tensors[name] = TensorInfo{piece.local.dtype(), global_shape_of(entry), {}};
      }
      for (const auto& report : reports) {
        if (report["file"].is_null()) continue;
        for (const auto& [name, chunk] : report["chunks"].items()) {
          TESSERA_CHECK(metadata.tensors.count(name) == 1, "checkpoint::save: '{}' is not in rank 0's state dict", name);
          metadata.tensors[name].chunks.push_back(ChunkInfo{report["file"].get<std::string>(),
                                                            chunk["byte_range"][0].get<int64_t>(),
                                                            chunk["byte_range"][1].get<int64_t>(),
                                                            chunk["offsets"].get<Shape>(), chunk["sizes"].get<Shape>(),
                                                            chunk["crc32c"].get<std::vector<uint32_t>>()});
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
  const dist::ProcessGroupPtr group = resolve_group(options.group);
  const int rank = rank_of(group);
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
    const Tensor local = piece_of(entry, rank).local;
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
    const Piece piece = piece_of(entry, rank);
    if (found == metadata.tensors.end() || !piece.local.defined()) continue;
    for (const ChunkInfo& chunk : found->second.chunks) {
      if (chunk_overlaps(chunk, piece.offsets, piece.local.sizes())) files_read.insert(chunk.file);
    }
  }
  for (const std::string& file : files_read) {
    const std::string path = (fs::path(dir) / file).string();
    metadata.check_rank_file_header(file, read_safetensors_header(path), path);
  }

  for (const auto& [name, entry] : state) {
    const auto found = metadata.tensors.find(name);
    if (found == metadata.tensors.end()) continue;
    Piece piece = piece_of(entry, rank);
    read_chunks(dir, found->second.chunks, found->second.dtype, name, piece.local, piece.offsets);
  }
  return report;
}

}  // namespace tessera::checkpoint
