// The file checks of a train launch, in the order they must hold.
#include "train/run_files.h"

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors_export.h"
#include "tensor/error.h"
#include "train/checkpoint_manager.h"
#include "train/corpus.h"
#include "train/file_roles.h"
#include "train/output_claim.h"
#include "train/step_log.h"

namespace tessera::train {

namespace fs = std::filesystem;
namespace checkpoint = tessera::checkpoint;

namespace {

// The export is written to PATH.tmp and renamed to PATH (safetensors_export.h,
// or hf_checkpoint.h for a directory).
std::string export_temporary(const std::string& path) { return checkpoint::export_temporary_path(path); }

// --format hf: the export is a Hugging Face model directory, replaced whole.
bool exports_directory(const TrainConfig& config) { return config.export_format == "hf"; }

FileRoles roles_of(const TrainConfig& config, const std::string& trace) {
  FileRoles roles;
  if (config.data.empty()) {
    for (const fs::path& file : default_corpus_files()) roles.add_input("--data (the default corpus)", file.string());
  } else if (config.data != kSyntheticData) {
    roles.add_input("--data", config.data);
  }
  if (!config.tokenizer.empty()) roles.add_input("--tokenizer", config.tokenizer);
  if (!config.init_from.empty()) roles.add_input("--init-from", config.init_from);
  if (!config.ckpt_dir.empty()) roles.add_output_directory("--ckpt-dir", config.ckpt_dir, is_managed_entry);
  if (!config.log_json.empty()) roles.add_output("--log-json", config.log_json);
  if (!trace.empty()) roles.add_output(trace == config.trace ? "--trace" : "--trace (this launch's)", trace);
  if (!trace.empty() && !is_special_file(trace)) roles.add_output("--trace's temporary file", partial_path(trace));
  if (!config.export_path.empty() && exports_directory(config)) {
    roles.add_output_directory("--export", config.export_path);
    roles.add_output_directory("--export's temporary directory", export_temporary(config.export_path));
  } else if (!config.export_path.empty()) {
    roles.add_output("--export", config.export_path);
    roles.add_output("--export's temporary file", export_temporary(config.export_path));
  }
  roles.add_output_stream("standard output", STDOUT_FILENO);
  roles.add_output_stream("standard error", STDERR_FILENO);
  return roles;
}

// A fresh run's outputs must not hold an earlier launch's files.
void refuse_existing(const TrainConfig& config, const char* flag, const std::string& path, const std::string& how) {
  if (!config.overwrite) refuse_existing_output(flag, path, how);
}

// --format hf: an existing directory is an earlier launch's export unless
// --overwrite; the parent must take new files; an interrupted export's
// PATH.tmp directory is replaced.
void check_export_directory(const TrainConfig& config, std::vector<std::string>& notices) {
  const std::string& path = config.export_path;
  std::error_code error;
  const fs::file_type type = fs::symlink_status(path, error).type();
  TESSERA_CHECK(type == fs::file_type::not_found || type == fs::file_type::directory,
                "--export {} --format hf: exists and is not a directory; the export is a model directory", path);
  TESSERA_CHECK(type == fs::file_type::not_found || config.overwrite,
                "--export {} already exists (an earlier launch's?); pass --overwrite to replace the directory when "
                "this run ends, or choose another path",
                path);
  const std::string temporary = export_temporary(path);
  const fs::file_type temporary_type = fs::symlink_status(temporary, error).type();
  TESSERA_CHECK(temporary_type == fs::file_type::not_found || temporary_type == fs::file_type::directory,
                "--export {}: {} exists and is not a directory; the export is written there first and renamed into "
                "place, so move it away",
                path, temporary);
  if (temporary_type == fs::file_type::directory) {
    notices.push_back(fmt::format("{} (an interrupted export) will be replaced by this run's export", temporary));
  }
  try {  // a probe file beside the directory-to-be
    checkpoint::check_can_create((fs::absolute(path).parent_path() / ".tessera-export").string());
  } catch (const tessera::Error& failure) {
    tessera::fail("--export {}: {}", path, failure.what());
  }
}

void check_export_temporary(const TrainConfig& config, std::vector<std::string>& notices) {
  if (config.export_path.empty()) return;
  const std::string temporary = export_temporary(config.export_path);
  std::error_code error;
  const fs::file_type type = fs::symlink_status(temporary, error).type();
  if (type == fs::file_type::not_found) return;
  TESSERA_CHECK(type == fs::file_type::regular,
                "--export {}: {} exists and is not a regular file (a directory or a link); the export is written there "
                "first and renamed into place, so move it away",
                config.export_path, temporary);
  notices.push_back(fmt::format("{} (an interrupted export) will be replaced by this run's export", temporary));
}

// The log a --resume continues: read strictly now, cut when it is opened.
void check_resumed_log(const TrainConfig& config, int64_t resume_step, std::vector<std::string>& notices) {
  StepLogCut cut;
  try {
    cut = scan_step_log(config.log_json, resume_step);
  } catch (const tessera::Error& error) {
    tessera::fail("--log-json {}", error.what());
  }
  if (cut.cut_lines > 0 || cut.cut_partial_line) {
    notices.push_back(fmt::format("{}: keeps its {} lines up to step {}, cuts {} line{} of later steps{} (trained again "
                                  "now)",
                                  config.log_json, cut.kept_lines, cut.last_kept_step, cut.cut_lines,
                                  cut.cut_lines == 1 ? "" : "s",
                                  cut.cut_partial_line ? " and an interrupted last line" : ""));
  } else if (cut.kept_lines > 0) {
    notices.push_back(fmt::format("{}: continues after its {} lines (to step {})", config.log_json, cut.kept_lines,
                                  cut.last_kept_step));
  }
}

}  // namespace

std::string resumed_trace_path(const std::string& path, int64_t first_step) {
  const fs::path original(path);
  for (int attempt = 1;; ++attempt) {
    const std::string suffix = attempt == 1 ? "" : fmt::format("-{}", attempt);
    fs::path candidate = original;
    candidate.replace_filename(fmt::format("{}.from-step-{}{}{}", original.stem().string(), first_step, suffix,
                                           original.extension().string()));
    if (!exists_no_follow(candidate.string())) return candidate.string();
  }
}

RunFiles settle_run_files(const TrainConfig& config, const FreeSpaceLookup& lookup) {
  RunFiles files;
  const bool resuming = config.resume && !config.ckpt_dir.empty();
  const std::vector<CheckpointEntry> existing =
      resuming ? list_checkpoints(config.ckpt_dir) : std::vector<CheckpointEntry>{};
  const int64_t resume_step = existing.empty() ? 0 : existing.back().step;

  files.trace = config.trace;
  if (resuming && !config.overwrite && !config.trace.empty() && exists_no_follow(config.trace) &&
      !is_special_file(config.trace)) {
    files.trace = resumed_trace_path(config.trace, resume_step + 1);
    files.notices.push_back(fmt::format("trace {} holds an earlier launch's; this launch writes {}", config.trace,
                                        files.trace));
  }
  roles_of(config, files.trace).check();

  TESSERA_CHECK(exports_directory(config) || !is_special_file(config.export_path),
                "--export {}: a device, FIFO or socket; the export is written to {} and renamed over it, which would "
                "replace it: give the path of a regular file",
                config.export_path, export_temporary(config.export_path));
  if (resuming && !config.log_json.empty() && !is_special_file(config.log_json)) {
    check_resumed_log(config, resume_step, files.notices);
  } else {
    refuse_existing(config, "--log-json", config.log_json,
                    "pass --resume (with its --ckpt-dir) to continue that run's log, --overwrite to replace it, or "
                    "choose another path");
  }
  refuse_existing(config, "--trace", files.trace,
                  "pass --overwrite to replace it, or choose another path (a --resume writes its trace beside it)");
  if (exports_directory(config) && !config.export_path.empty()) {
    check_export_directory(config, files.notices);
  } else {
    refuse_existing(config, "--export", config.export_path,
                    "pass --overwrite to replace it when this run ends, or choose another path");
    check_export_temporary(config, files.notices);
  }
  const std::string export_file = exports_directory(config) ? "" : config.export_path;
  for (const auto& [flag, path] : {std::pair{"--export", export_file}, std::pair{"--trace", files.trace},
                                   std::pair{"--log-json", config.log_json}}) {
    if (path.empty() || is_special_file(path)) continue;  // /dev/null is there to be written
    try {
      checkpoint::check_can_create(path);
    } catch (const tessera::Error& failure) {
      tessera::fail("{} {}", flag, failure.what());  // the error starts with the path
    }
  }
  check_disk_space(config, resume_step, static_cast<int64_t>(existing.size()), lookup);
  return files;
}

}  // namespace tessera::train
