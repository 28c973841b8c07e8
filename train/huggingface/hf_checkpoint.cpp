// Loading a rank's pieces from a Hugging Face model directory; exporting one through rank 0.
#include "train/huggingface/hf_checkpoint.h"

#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "checkpoint/chunk_reader.h"
#include "checkpoint/file_io.h"
#include "checkpoint/rank_errors.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/safetensors_index.h"
#include "tensor/error.h"
#include "train/huggingface/hf_tensor_map.h"

namespace tessera::train {

namespace fs = std::filesystem;
namespace checkpoint = tessera::checkpoint;

namespace {

// GPT-2 files saved by older transformers name tensors without "transformer.".
constexpr std::string_view kGptPrefix = "transformer.";

// The stored name of `hf_name` in `index`: GPT-2's without its prefix when
// the files were saved that way.
std::string stored_name(const checkpoint::SafetensorsIndex& index, const std::string& hf_name) {
  if (index.contains(hf_name) || !hf_name.starts_with(kGptPrefix)) return hf_name;
  const std::string unprefixed = hf_name.substr(kGptPrefix.size());
  return index.contains(unprefixed) ? unprefixed : hf_name;
}

// A stored tensor that is not a parameter tessera loads, and that the model
// the config describes may carry: causal-mask and inv_freq buffers, and
// GPT-2's lm_head.weight when a file stores the tied head a second time.
bool may_be_left(const ModelConfig& config, const std::string& stored) {
  return is_ignored_hf_tensor(stored) || (family_of(config) == ModelFamily::gpt && stored == "lm_head.weight");
}

void write_text_file(const std::string& path, const std::string& text, bool sync) {
  checkpoint::WriteFile file(path);
  file.write(text.data(), static_cast<int64_t>(text.size()));
  file.close(sync);
}

// Rank 0's side of export_hf: the files of DIR.tmp, one shard open at a time.
class HfDirectorySink final : public checkpoint::ExportSink {
 public:
  HfDirectorySink(std::string dir, const ModelConfig& config, const HfExportOptions& options)
      : dir_(std::move(dir)), tmp_(checkpoint::export_temporary_path(dir_)), config_(config), options_(options) {}

  void begin(const std::vector<checkpoint::SafetensorsEntry>& entries) override {
    std::vector<checkpoint::SafetensorsEntry> stored;
    for (const checkpoint::SafetensorsEntry& entry : entries) {
      const HfTensor tensor = hf_tensor_for(config_, entry.name, entry.shape);
      stored.push_back({tensor.hf_name, entry.dtype, tensor.hf_shape});
      tensors_.emplace(entry.name, tensor);
    }
    shards_ = checkpoint::plan_safetensors_shards(stored, options_.max_shard_bytes);
    // Emptied, not replaced: a claim (output_claim.h) holds this very directory.
    fs::create_directories(tmp_);
    for (const fs::directory_entry& leftover : fs::directory_iterator(tmp_)) fs::remove_all(leftover.path());
    const HfCompanions companions = hf_companions(config_, options_.sources);
    write_text_file((fs::path(tmp_) / kHfConfigFile).string(),
                    hf_config_from_model(config_, companions.token_ids).dump(2) + "\n", options_.sync);
    for (const HfExportFile& file : companions.files) {
      write_text_file((fs::path(tmp_) / file.name).string(), file.bytes, options_.sync);
    }
  }

  void write(const std::string& name, const tessera::Tensor& whole) override {
    if (!writer_ || written_in_shard_ == shards_[shard_].entries.size()) open_next_shard();
    writer_->append(to_hf_layout(tensors_.at(name), whole));
    ++written_in_shard_;
  }

  void commit() override {
    if (!writer_) open_next_shard();  // a model without tensors still gets its (empty) file
    writer_->close(options_.sync);
    writer_.reset();
    if (shards_.size() > 1) {
      write_text_file((fs::path(tmp_) / checkpoint::kSafetensorsIndexFile).string(),
                      checkpoint::safetensors_index_json(shards_), options_.sync);
    }
    if (options_.sync) checkpoint::sync_directory(tmp_);
    complete_ = true;
    if (options_.publish == checkpoint::Publish::no_clobber) {
      checkpoint::publish(tmp_, dir_, checkpoint::Publish::no_clobber);
    } else {
      // Replace DIR only once the new one is complete: DIR -> DIR.old, DIR.tmp -> DIR.
      const std::string old = dir_ + ".old";
      std::error_code ignored;
      fs::remove_all(old, ignored);
      if (fs::exists(dir_)) fs::rename(dir_, old);
      fs::rename(tmp_, dir_);
      fs::remove_all(old, ignored);
    }
    if (options_.sync) checkpoint::sync_directory(fs::absolute(dir_).parent_path().string());
  }

  // A complete directory that could not be published stays, named in the error.
  void abandon() noexcept override {
    writer_.reset();
    std::error_code ignored;
    if (!complete_) fs::remove_all(tmp_, ignored);
  }

 private:
  void open_next_shard() {
    if (writer_) writer_->close(options_.sync);
    shard_ = writer_ ? shard_ + 1 : 0;
    const checkpoint::SafetensorsShard& shard = shards_.at(shard_);
    // transformers refuses safetensors without {"format": "pt"} (what save_pretrained writes).
    writer_.emplace((fs::path(tmp_) / shard.file).string(),
                    checkpoint::layout_safetensors(shard.entries, {{"format", "pt"}}));
    written_in_shard_ = 0;
  }

  std::string dir_;
  std::string tmp_;
  const ModelConfig& config_;
  const HfExportOptions& options_;
  std::map<std::string, HfTensor> tensors_;  // by tessera's name
  std::vector<checkpoint::SafetensorsShard> shards_;
  size_t shard_ = 0;
  size_t written_in_shard_ = 0;
  std::optional<checkpoint::SafetensorsWriter> writer_;
  bool complete_ = false;
};

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error) && fs::exists(fs::path(path) / kHfConfigFile, error);
}

bool holds_tokenizer(const std::string& dir) {
  const fs::path root(dir);
  std::error_code error;
  return fs::exists(root / "tokenizer.json", error) ||
         (fs::exists(root / "vocab.json", error) && fs::exists(root / "merges.txt", error));
}

HfModelInfo read_hf_model_info(const std::string& dir) {
  const std::string path = (fs::path(dir) / kHfConfigFile).string();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(checkpoint::read_file_text(path));
  } catch (const nlohmann::json::parse_error& error) {
    tessera::fail("{}: not valid JSON: {}", path, error.what());
  }
  return hf_model_from_config(json, path);
}

void load_hf_weights(const std::string& dir, const HfModelInfo& info, const checkpoint::DistributedStateDict& state) {
  const checkpoint::SafetensorsIndex index = checkpoint::SafetensorsIndex::open(dir);
  struct Planned {
    HfTensor tensor;
    checkpoint::StoredTensor stored;
    std::vector<checkpoint::LocalBox> boxes;  // one, or a tensor-parallel piece's
  };
  std::vector<Planned> plan;
  std::vector<std::string> problems, missing;
  std::set<std::string> used;
  for (const auto& [name, entry] : state) {
    const std::vector<checkpoint::LocalBox> boxes = checkpoint::local_boxes_of(entry);
    const checkpoint::LocalBox& box = boxes.front();
    const HfTensor tensor = hf_tensor_for(info.config, name, checkpoint::global_shape_of(entry));
    std::string stored = stored_name(index, tensor.hf_name);
    if (info.tied_head && name == "output.weight" && !index.contains(stored)) stored = "model.embed_tokens.weight";
    if (!index.contains(stored)) {
      missing.push_back(fmt::format("{} (tessera's {})", tensor.hf_name, name));
      continue;
    }
    used.insert(stored);
    const checkpoint::StoredTensor found = index.at(stored);
    if (found.entry->shape != tensor.hf_shape) {
      problems.push_back(fmt::format("{}: shape {} in {}, {} for its config (tessera's {} is {})", stored,
                                     found.entry->shape, found.path, tensor.hf_shape, name, tensor.shape));
    }
    if (!checkpoint::loads_into(found.entry->dtype, box.local.dtype())) {
      problems.push_back(fmt::format("{}: dtype {} in {} does not load into tessera's {} {}", stored,
                                     checkpoint::safetensors_dtype(found.entry->dtype), found.path,
                                     tessera::dtype_name(box.local.dtype()), name));
    }
    plan.push_back({tensor, found, boxes});
  }
  if (!missing.empty()) problems.push_back(fmt::format("missing: {}", fmt::join(missing, ", ")));
  std::vector<std::string> unexpected;
  for (const std::string& name : index.names()) {
    if (used.count(name) == 0 && !may_be_left(info.config, name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    problems.push_back(fmt::format("tensors the model its config describes does not have: {}",
                                   fmt::join(unexpected, ", ")));
  }
  TESSERA_CHECK(problems.empty(), "{}: not the model its {} describes: {}", dir, kHfConfigFile,
                fmt::join(problems, "; "));

  for (const Planned& planned : plan) {
    for (const checkpoint::LocalBox& box : planned.boxes) {
      read_in_tessera_layout(planned.tensor, box.local, box.offsets,
                             [&](const tessera::Tensor& hf_box, const tessera::Shape& offsets) {
                               checkpoint::read_safetensors_box(planned.stored.path, *planned.stored.header,
                                                                *planned.stored.entry, hf_box, offsets);
                             });
    }
  }
}

void export_hf(const std::string& dir, const ModelConfig& config, const checkpoint::DistributedStateDict& state,
               const HfExportOptions& options) {
  const tessera::dist::ProcessGroupPtr group = checkpoint::resolve_group(options.group);
  std::optional<HfDirectorySink> sink;
  if (checkpoint::rank_of(group) == 0) sink.emplace(dir, config, options);
  checkpoint::export_through_rank0(state, group, sink ? &*sink : nullptr);
}

}  // namespace tessera::train
