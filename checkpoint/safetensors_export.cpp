// Full-model export through rank 0, one gathered tensor at a time, and
// import of each rank's piece by byte ranges of the one file.
#include "checkpoint/safetensors_export.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>

#include "autograd/grad_mode.h"
#include "checkpoint/checksum.h"
#include "checkpoint/chunk_reader.h"
#include "checkpoint/file_io.h"
#include "checkpoint/rank_errors.h"
#include "checkpoint/safetensors.h"
#include "tensor/ops.h"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

// ---- export: agreeing on what to write -------------------------------------------------------------

// "name: f32 [97, 5] sharded", one per entry (all defined): what every rank must agree on.
std::vector<std::string> describe_entries(const DistributedStateDict& state) {
  std::vector<std::string> descriptions;
  for (const auto& [name, entry] : state) {
    const DType dtype = local_boxes_of(entry).front().local.dtype();
    descriptions.push_back(fmt::format("{}: {} {} {}", name, dtype_name(dtype), global_shape_of(entry),
                                       std::holds_alternative<Tensor>(entry) ? "whole" : "sharded"));
  }
  return descriptions;
}

uint32_t fingerprint(const std::vector<std::string>& descriptions) {
  uint32_t crc = 0;
  for (const std::string& text : descriptions) crc = crc32c(text.data(), text.size() + 1, crc);  // with its '\0'
  return crc;
}

// This rank's part of the plan: its entries checked, their fingerprint, and
// the boxes it owns of DTensors and boxed pieces (a whole tensor is rank 0's
// alone), each with its index among the rank's local boxes.
nlohmann::json local_plan(const DistributedStateDict& state, int rank) {
  nlohmann::json pieces = nlohmann::json::object();
  for (const auto& [name, entry] : state) {
    TESSERA_CHECK(!name.empty() && name != "__metadata__", "bad tensor name '{}'", name);
    const std::vector<LocalBox> boxes = local_boxes_of(entry);
    for (const LocalBox& box : boxes) TESSERA_CHECK(box.local.defined(), "'{}' is an undefined tensor", name);
    if (!writes_piece(entry, rank) || std::holds_alternative<Tensor>(entry)) continue;
    for (size_t index = 0; index < boxes.size(); ++index) {
      if (boxes[index].local.numel() == 0) continue;
      pieces[name].push_back({{"box", index}, {"offsets", boxes[index].offsets}, {"sizes", boxes[index].local.sizes()}});
    }
  }
  return {{"fingerprint", fingerprint(describe_entries(state))}, {"pieces", pieces}};
}

// Throws on every rank when the ranks disagree on names, dtypes, shapes or
// kinds, naming what differs from rank 0. The lists travel only then.
void check_same_entries(const dist::ProcessGroupPtr& group, const std::vector<nlohmann::json>& plans,
                        const DistributedStateDict& state) {
  const bool agree = std::all_of(plans.begin(), plans.end(),
                                 [&](const auto& plan) { return plan["fingerprint"] == plans[0]["fingerprint"]; });
  if (agree) return;
  const std::vector<nlohmann::json> lists = gather_json(group, describe_entries(state));
  auto sorted = [](const nlohmann::json& list) {
    auto entries = list.get<std::vector<std::string>>();
    std::sort(entries.begin(), entries.end());
    return entries;
  };
  const std::vector<std::string> reference = sorted(lists[0]);
  std::vector<std::string> differences;
  for (size_t rank = 1; rank < lists.size(); ++rank) {
    const std::vector<std::string> other = sorted(lists[rank]);
    std::vector<std::string> only_other, only_reference;
    std::set_difference(other.begin(), other.end(), reference.begin(), reference.end(), std::back_inserter(only_other));
    std::set_difference(reference.begin(), reference.end(), other.begin(), other.end(),
                        std::back_inserter(only_reference));
    if (only_other.empty() && only_reference.empty()) continue;
    differences.push_back(fmt::format("rank {} passes [{}] where rank 0 passes [{}]", rank,
                                      fmt::join(only_other, "; "), fmt::join(only_reference, "; ")));
  }
  fail("checkpoint::export_safetensors: every rank must pass the same names, dtypes and global shapes: {}",
       fmt::join(differences, "; "));
}

// One owned piece of a sharded tensor: the group rank that holds it, which of
// its local boxes it is, and where it sits.
struct OwnedPiece {
  int rank = 0;
  size_t box = 0;
  Shape offsets;
  Shape sizes;
};

bool boxes_overlap(const OwnedPiece& a, const OwnedPiece& b) {
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    if (std::max(a.offsets[d], b.offsets[d]) >= std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d])) {
      return false;
    }
  }
  return true;
}

// The owned pieces of every DTensor, in rank order, checked to tile it
// exactly. Every rank sees the same plans, so every rank reaches the same verdict.
std::map<std::string, std::vector<OwnedPiece>> owned_pieces(const std::vector<nlohmann::json>& plans,
                                                            const DistributedStateDict& state) {
  std::map<std::string, std::vector<OwnedPiece>> pieces;
  for (size_t rank = 0; rank < plans.size(); ++rank) {
    for (const auto& [name, boxes] : plans[rank]["pieces"].items()) {
      for (const auto& piece : boxes) {
        pieces[name].push_back({static_cast<int>(rank), piece["box"].get<size_t>(), piece["offsets"].get<Shape>(),
                                piece["sizes"].get<Shape>()});
      }
    }
  }
  for (const auto& [name, entry] : state) {
    if (std::holds_alternative<Tensor>(entry)) continue;
    const Shape& shape = global_shape_of(entry);
    int64_t covered = 0;
    const std::vector<OwnedPiece>& owned = pieces[name];
    for (size_t i = 0; i < owned.size(); ++i) {
      for (size_t d = 0; d < shape.size(); ++d) {
        TESSERA_CHECK(owned[i].offsets[d] + owned[i].sizes[d] <= shape[d],
                      "checkpoint::export_safetensors: rank {}'s piece of '{}' (at {}, sizes {}) lies outside {}",
                      owned[i].rank, name, owned[i].offsets, owned[i].sizes, shape);
      }
      for (size_t j = 0; j < i; ++j) {
        TESSERA_CHECK(!boxes_overlap(owned[i], owned[j]),
                      "checkpoint::export_safetensors: ranks {} and {} both own part of '{}'; is its mesh over the "
                      "export group?",
                      owned[j].rank, owned[i].rank, name);
      }
      covered += shape_numel(owned[i].sizes);
    }
    TESSERA_CHECK(covered == shape_numel(shape),
                  "checkpoint::export_safetensors: the ranks own {} of the {} elements of '{}'; is its mesh over the "
                  "export group?",
                  covered, shape_numel(shape), name);
  }
  return pieces;
}

// ---- export: moving the bytes -----------------------------------------------------------------------

// The whole tensor on rank 0 (undefined elsewhere). Each piece comes from its
// owner in one broadcast (there is no gather; an all-gather would put the
// whole tensor on every rank) through a byte buffer (collectives carry
// numbers, not bool), so rank 0 holds the tensor plus one piece in flight.
Tensor gather_to_rank0(const dist::ProcessGroupPtr& group, int rank, const StateEntry& entry,
                       const std::vector<OwnedPiece>& pieces) {
  const std::vector<LocalBox> boxes = local_boxes_of(entry);
  const DType dtype = boxes.front().local.dtype();
  const Shape& global_shape = global_shape_of(entry);
  if (pieces.empty()) return rank == 0 ? ops::empty(global_shape, {.dtype = dtype}) : Tensor();
  const bool one_piece = pieces.size() == 1;  // e.g. replicated: the piece is the tensor
  Tensor whole;
  if (rank == 0 && !one_piece) whole = ops::empty(global_shape, {.dtype = dtype});
  for (const OwnedPiece& piece : pieces) {
    Tensor received;
    // A device piece comes through a page-locked buffer.
    if (rank == piece.rank) received = ops::to(boxes.at(piece.box).local, kCPU);
    if (piece.rank != 0) {
      const int64_t bytes = shape_numel(piece.sizes) * static_cast<int64_t>(element_size(dtype));
      const Tensor wire = ops::empty({(bytes + 7) / 8}, {.dtype = DType::i64});
      const Tensor mine = received;
      received = Tensor::make(wire.storage(), piece.sizes, contiguous_strides(piece.sizes), 0, dtype);
      if (rank == piece.rank) ops::copy_(received, mine);
      group->broadcast(wire, piece.rank);
    }
    if (rank != 0) continue;
    if (one_piece) return received;
    Tensor box = whole;
    for (size_t d = 0; d < piece.sizes.size(); ++d) {
      box = ops::narrow(box, static_cast<int64_t>(d), piece.offsets[d], piece.sizes[d]);
    }
    ops::copy_(box, received);
  }
  return whole;
}

}  // namespace

void export_through_rank0(const DistributedStateDict& state, const dist::ProcessGroupPtr& group_option,
                          ExportSink* sink) {
  check_no_pending_sums(state, "checkpoint export");
  const dist::ProcessGroupPtr group = resolve_group(group_option);
  const int rank = rank_of(group);
  TESSERA_CHECK(rank != 0 || sink != nullptr, "checkpoint::export_through_rank0: rank 0 needs a sink");
  autograd::NoGradGuard no_grad;  // copies the values of tensors that may require grad (live parameters)

  nlohmann::json plan;
  try {
    plan = local_plan(state, rank);
  } catch (const std::exception& error) {
    plan = {{"error", error.what()}};
  }
  const std::vector<nlohmann::json> plans = gather_json(group, plan);
  rethrow_any(plans, "export_safetensors");
  check_same_entries(group, plans, state);
  const std::map<std::string, std::vector<OwnedPiece>> pieces = owned_pieces(plans, state);

  // Rank 0 keeps taking part in every collective after a failed write, so
  // that its error reaches the others at the next agreement instead of a hang.
  nlohmann::json outcome = nlohmann::json::object();
  auto on_rank0 = [&](const std::function<void()>& step) {
    if (rank == 0 && !outcome.contains("error")) outcome = report_of(step);
  };
  auto agree = [&] {
    if (rank == 0 && outcome.contains("error")) sink->abandon();
    rethrow_any(gather_json(group, outcome), "export_safetensors");
  };

  on_rank0([&] {
    std::vector<SafetensorsEntry> entries;
    for (const auto& [name, entry] : state) {
      entries.push_back({name, local_boxes_of(entry).front().local.dtype(), global_shape_of(entry)});
    }
    sink->begin(entries);
  });
  agree();  // fail before moving any tensor when the output cannot be created

  for (const auto& [name, entry] : state) {
    if (const Tensor* whole = std::get_if<Tensor>(&entry)) {
      on_rank0([&] { sink->write(name, ops::to(*whole, kCPU)); });
      continue;
    }
    const auto found = pieces.find(name);
    const Tensor gathered =
        gather_to_rank0(group, rank, entry, found == pieces.end() ? std::vector<OwnedPiece>{} : found->second);
    on_rank0([&] { sink->write(name, gathered); });
  }
  on_rank0([&] { sink->commit(); });
  agree();
}

namespace {

// One .safetensors file, written to PATH.tmp and published as PATH once complete.
class SingleFileSink final : public ExportSink {
 public:
  SingleFileSink(std::string path, const ExportOptions& options)
      : path_(std::move(path)), tmp_(export_temporary_path(path_)), options_(options) {}

  void begin(const std::vector<SafetensorsEntry>& entries) override {
    writer_.emplace(tmp_, layout_safetensors(entries, options_.metadata));
  }
  void write(const std::string& /*name*/, const Tensor& whole) override { writer_->append(whole); }
  void commit() override {
    writer_->close(options_.sync);
    complete_ = true;
    publish(tmp_, path_, options_.publish);
    if (options_.sync) sync_directory(fs::absolute(path_).parent_path().string());
  }
  // A complete file that could not be published stays, named in the error.
  void abandon() noexcept override {
    writer_.reset();
    std::error_code ignored;
    if (!complete_) fs::remove(tmp_, ignored);
  }

 private:
  std::string path_;
  std::string tmp_;
  const ExportOptions& options_;
  std::optional<SafetensorsWriter> writer_;
  bool complete_ = false;
};

}  // namespace

std::string export_temporary_path(const std::string& path) { return path + ".tmp"; }

void export_safetensors(const std::string& path, const DistributedStateDict& state, const ExportOptions& options) {
  const dist::ProcessGroupPtr group = resolve_group(options.group);
  std::optional<SingleFileSink> sink;
  if (rank_of(group) == 0) sink.emplace(path, options);
  export_through_rank0(state, group, sink ? &*sink : nullptr);
}

void read_safetensors_box(const std::string& path, const SafetensorsHeader& header, const SafetensorsEntry& entry,
                          const Tensor& destination, const Shape& offsets) {
  // The whole file tensor as one chunk (no checksums): only its overlap with the box is read.
  const fs::path file(path);
  const ChunkInfo chunk{file.filename().string(), header.data_offset + entry.begin, header.data_offset + entry.end,
                        Shape(entry.shape.size(), 0), entry.shape, {}};
  read_chunks(file.parent_path().string(), {chunk}, entry.dtype, entry.name, destination, offsets);
}

ImportReport import_safetensors(const std::string& path, const DistributedStateDict& state,
                                const ImportOptions& options) {
  const SafetensorsHeader header = read_safetensors_header(path);
  std::map<std::string, const SafetensorsEntry*> stored;
  for (const SafetensorsEntry& entry : header.entries) stored[entry.name] = &entry;

  ImportReport report;
  report.metadata = header.metadata;
  std::vector<std::string> problems;
  for (const auto& [name, entry] : state) {
    if (!local_boxes_of(entry).front().local.defined()) {
      problems.push_back(fmt::format("{}: undefined; there is no tensor to fill", name));
      continue;
    }
    const auto found = stored.find(name);
    if (found == stored.end()) {
      report.missing_keys.push_back(name);
      continue;
    }
    const SafetensorsEntry& file_entry = *found->second;
    if (file_entry.shape != global_shape_of(entry)) {
      problems.push_back(fmt::format("{}: shape {} in the file, {} here", name, file_entry.shape, global_shape_of(entry)));
    }
    const DType here = local_boxes_of(entry).front().local.dtype();
    if (!loads_into(file_entry.dtype, here)) {
      problems.push_back(fmt::format("{}: dtype {} in the file, {} here (only a float loads into a float; an integer "
                                     "or bool only into its own dtype)",
                                     name, safetensors_dtype(file_entry.dtype), dtype_name(here)));
    }
  }
  for (const auto& [name, entry] : stored) {
    if (state.count(name) == 0) report.unexpected_keys.push_back(name);
  }
  if (options.strict) {
    if (!report.missing_keys.empty()) {
      problems.push_back(fmt::format("missing keys: {}", fmt::join(report.missing_keys, ", ")));
    }
    if (!report.unexpected_keys.empty()) {
      problems.push_back(fmt::format("unexpected keys: {}", fmt::join(report.unexpected_keys, ", ")));
    }
  }
  TESSERA_CHECK(problems.empty(), "checkpoint::import_safetensors: {} does not fit the state dict: {}", path,
                fmt::join(problems, "; "));

  for (const auto& [name, entry] : state) {
    const auto found = stored.find(name);
    if (found == stored.end()) continue;
    for (const LocalBox& box : local_boxes_of(entry)) {
      read_safetensors_box(path, header, *found->second, box.local, box.offsets);
    }
  }
  return report;
}

}  // namespace tessera::checkpoint
