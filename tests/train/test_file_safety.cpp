// Nothing a user types can destroy data: each mistake the issue reproduced,
// run through `train` itself, is refused before the first step with both
// flags named, and every file involved is byte for byte what it was; a
// resumed run continues its log and its trace instead of replacing them;
// every path problem and a too small disk are found before step 1; a stop
// takes effect between micro-batches.
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "checkpoint/save_points.h"
#include "tensor/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/text_file.h"
#include "tests/train/train_outcome.h"
#include "train/checkpoint_manager.h"
#include "train/disk_space.h"
#include "train/flag_checks.h"
#include "train/graceful_stop.h"
#include "train/run_files.h"
#include "train/step_log.h"
#include "train/trainer.h"
#include "train/training_run.h"

namespace fs = std::filesystem;
namespace checkpoint = tessera::checkpoint;
using tessera::train::TrainConfig;
using tessera::train::testing::Outcome;
using tessera::train::testing::run;
using tessera::train::testing::trained_a_step;
using tessera::checkpoint::testing::TempDir;

using tessera::testing::contains;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A small text corpus, enough for the nano model's batches.
std::string corpus_text() {
  std::string text;
  for (int line = 0; line < 200; ++line) text += "the quick brown fox jumps over the lazy dog " + std::to_string(line) + "\n";
  return text;
}

TrainConfig config_reading(const std::string& data) {
  TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("nano");
  config.data = data;
  config.seq_len = 16;
  config.batch = 4;
  config.steps = 6;
  config.warmup = 2;
  config.eval_every = 0;
  return config;
}


std::vector<int64_t> logged_steps(const std::string& path) {
  std::vector<int64_t> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return steps;
}

}  // namespace

TEST_CASE("file safety: an output naming an input or another output is refused; every byte stays") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt";
  write_bytes(corpus, corpus_text());
  fs::create_symlink("c.txt", tmp / "link.txt");
  fs::create_hard_link(corpus, tmp / "hard.txt");
  write_bytes(tmp / "t.json", "an earlier trace");
  struct Case {
    const char* what;
    std::function<void(TrainConfig&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"log over the corpus", [&](TrainConfig& c) { c.log_json = corpus; },
       "--log-json " + corpus + " is the input --data " + corpus},
      {"export over the corpus", [&](TrainConfig& c) { c.export_path = corpus; },
       "--export " + corpus + " is the input --data " + corpus},
      {"log through a symbolic link", [&](TrainConfig& c) { c.log_json = tmp / "link.txt"; },
       "--log-json " + (tmp / "link.txt") + " is the input --data " + corpus},
      {"log over a hard link", [&](TrainConfig& c) { c.log_json = tmp / "hard.txt"; },
       "(one file under two names: a symbolic or hard link)"},
      {"trace and log on one file", [&](TrainConfig& c) { c.trace = c.log_json = tmp / "out.json"; },
       "--log-json " + (tmp / "out.json") + " and --trace " + (tmp / "out.json") + " are the same file"},
      {"export over the weights it starts from", [&](TrainConfig& c) { c.init_from = c.export_path = corpus; },
       "--export " + corpus + " is the input"},
      {"the export's temporary file over the log", [&](TrainConfig& c) {
         c.export_path = tmp / "m.safetensors";
         c.log_json = tmp / "m.safetensors.tmp";
       }, "--export's temporary file " + (tmp / "m.safetensors.tmp")},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    TrainConfig config = config_reading(corpus);
    c.set(config);
    const Outcome refused = run(config);
    INFO(refused.error);
    CHECK(contains(refused.error, c.message));
    CHECK(refused.usage_error);
    CHECK_FALSE(trained_a_step(refused));
    CHECK(read_bytes(corpus) == corpus_text());
    CHECK(read_bytes(tmp / "t.json") == "an earlier trace");
    CHECK_FALSE(fs::exists(tmp / "out.json"));
  }
}

TEST_CASE("file safety: an output inside the checkpoint root is refused; run.json and the run stay resumable") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt";
  write_bytes(corpus, corpus_text());
  TrainConfig config = config_reading(corpus);
  config.ckpt_dir = tmp / "r";
  config.steps = 2;
  REQUIRE(run(config).error.empty());
  const std::string record = read_bytes(tmp / "r/run.json");
  for (const char* inside : {"r/run.json", "r/log.jsonl", "r/step-00000002/extra"}) {
    TrainConfig resume = config;
    resume.resume = true;
    resume.steps = 4;
    resume.log_json = tmp / inside;
    const Outcome refused = run(resume);
    CHECK(contains(refused.error, "--log-json " + (tmp / inside) + " lies inside --ckpt-dir " + (tmp / "r")));
    CHECK_FALSE(trained_a_step(refused));
    CHECK(read_bytes(tmp / "r/run.json") == record);
  }
  TrainConfig resume = config;
  resume.resume = true;
  REQUIRE(run(resume).error.empty());  // still resumable
}

TEST_CASE("file safety: /dev/null takes the log and the trace, fresh or resumed, but never the export") {
  TempDir tmp;
  TrainConfig config = config_reading(tessera::train::kSyntheticData);
  config.steps = 2;
  config.ckpt_dir = tmp / "r";
  config.log_json = config.trace = "/dev/null";  // devices are written to, never replaced
  REQUIRE(run(config).error.empty());
  TrainConfig resume = config;
  resume.resume = true;
  resume.steps = 3;
  const Outcome resumed = run(resume);
  REQUIRE(resumed.error.empty());
  CHECK(contains(resumed.log, "trace    /dev/null"));
  TrainConfig exported = config_reading(tessera::train::kSyntheticData);
  exported.export_path = "/dev/null";
  const Outcome refused = run(exported);
  CHECK(contains(refused.error, "--export /dev/null: a device, FIFO or socket; the export is written to "
                                "/dev/null.tmp and renamed over it"));
  CHECK(fs::is_character_file("/dev/null"));
  CHECK_FALSE(fs::exists("/dev/null.tmp"));
}

TEST_CASE("file safety: a fresh run refuses an earlier launch's log, trace or export unless --overwrite") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt";
  write_bytes(corpus, corpus_text());
  const std::string earlier = "{\"step\": 1, \"loss\": 5.0}\n";
  for (const char* flag : {"--log-json", "--trace", "--export"}) {
    INFO(flag);
    const std::string path = tmp / (std::string("out") + flag);
    write_bytes(path, earlier);
    TrainConfig config = config_reading(corpus);
    config.steps = 2;
    std::string& field = std::string(flag) == "--log-json" ? config.log_json
                         : std::string(flag) == "--trace"  ? config.trace
                                                           : config.export_path;
    field = path;
    const Outcome refused = run(config);
    CHECK(contains(refused.error, std::string(flag) + " " + path + " already exists (an earlier launch's?)"));
    CHECK(contains(refused.error, "--overwrite to replace it"));
    CHECK_FALSE(trained_a_step(refused));
    CHECK(read_bytes(path) == earlier);
    config.overwrite = true;
    REQUIRE(run(config).error.empty());
    CHECK(read_bytes(path) != earlier);
  }
  // An empty file (mktemp's) is no earlier launch's.
  write_bytes(tmp / "empty.jsonl", "");
  TrainConfig config = config_reading(corpus);
  config.steps = 2;
  config.log_json = tmp / "empty.jsonl";
  REQUIRE(run(config).error.empty());
  CHECK(logged_steps(tmp / "empty.jsonl") == std::vector<int64_t>{1, 2});
}

TEST_CASE("file safety: a resume continues the log: later steps are cut, the rest stays byte for byte") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt", log = tmp / "L.jsonl";
  write_bytes(corpus, corpus_text());
  TrainConfig config = config_reading(corpus);
  config.ckpt_dir = tmp / "r";
  config.ckpt_every = 3;
  config.log_json = log;
  config.steps = 5;
  REQUIRE(run(config).error.empty());  // steps 1-5, checkpoints 3 and 5
  fs::remove_all(tessera::train::checkpoint_path(tmp / "r", 5));  // as if killed after step 5's log line, before its save
  const std::string first_three = [&] {
    std::string text = read_bytes(log);
    size_t end = 0;
    for (int line = 0; line < 3; ++line) end = text.find('\n', end) + 1;
    return text.substr(0, end);
  }();
  std::ofstream(log, std::ios::app) << "{\"step\": 6, \"lo";  // and a write cut short

  TrainConfig resume = config;
  resume.resume = true;
  const Outcome resumed = run(resume);
  REQUIRE(resumed.error.empty());
  CHECK(contains(resumed.log, "files    " + log + ": keeps its 3 lines up to step 3, cuts 2 lines of later steps and "
                                                "an interrupted last line (trained again now)"));
  CHECK(logged_steps(log) == std::vector<int64_t>{1, 2, 3, 4, 5});
  CHECK(read_bytes(log).substr(0, first_three.size()) == first_three);

  // A file that is not train's log is never cut.
  const std::string foreign = "line one of my notes\nline two\n";
  write_bytes(tmp / "notes.txt", foreign);
  TrainConfig other = resume;
  other.log_json = tmp / "notes.txt";
  other.steps = 7;
  const Outcome refused = run(other);
  CHECK(contains(refused.error, "--log-json " + (tmp / "notes.txt") + ": line 1 is not a step record of train's log"));
  CHECK_FALSE(trained_a_step(refused));
  CHECK(read_bytes(tmp / "notes.txt") == foreign);
}

TEST_CASE("file safety: the log's reader is strict and its cut exact") {
  TempDir tmp;
  const std::string log = tmp / "L.jsonl";
  write_bytes(log, "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
  const tessera::train::StepLogCut cut = tessera::train::scan_step_log(log, 2);
  CHECK(cut.keep_bytes == 22);
  CHECK(cut.kept_lines == 2);
  CHECK(cut.last_kept_step == 2);
  CHECK(cut.cut_lines == 1);
  CHECK_FALSE(cut.cut_partial_line);
  CHECK(tessera::train::scan_step_log(tmp / "absent.jsonl", 5).keep_bytes == 0);
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"{\"step\":1}\n[1]\n", "line 2 is not a step record of train's log (not a JSON object)"},
           {"{\"loss\":1}\n", "line 1 is not a step record of train's log (no integer \"step\")"},
           {"{\"step\":1.5}\n", "no integer \"step\""},
           {"{\"step\":0}\n", "step 0 is below 1"},
           {"{\"step\":2}\n{\"step\":2}\n", "step 2 follows step 2"},
       }) {
    write_bytes(log, text);
    CHECK_THROWS_WITH_AS(tessera::train::scan_step_log(log, 1), doctest::Contains(why.c_str()), tessera::Error);
    CHECK_THROWS_AS(tessera::train::StepLog::resume(log, 1), tessera::Error);
    CHECK(read_bytes(log) == text);  // refused before anything is cut
  }
}

TEST_CASE("file safety: a resumed launch writes its trace beside the earlier one and names it") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt", trace = tmp / "t.json";
  write_bytes(corpus, corpus_text());
  TrainConfig config = config_reading(corpus);
  config.ckpt_dir = tmp / "r";
  config.ckpt_every = 2;
  config.trace = trace;
  REQUIRE(run(config).error.empty());
  const std::string first_trace = read_bytes(trace);
  fs::remove_all(tessera::train::checkpoint_path(tmp / "r", 6));
  fs::remove_all(tessera::train::checkpoint_path(tmp / "r", 4));
  TrainConfig resume = config;
  resume.resume = true;
  for (const char* expected : {"t.from-step-3.json", "t.from-step-3-2.json"}) {
    const Outcome resumed = run(resume);
    REQUIRE(resumed.error.empty());
    CHECK(contains(resumed.log, "files    trace " + trace + " holds an earlier launch's; this launch writes " +
                                    (tmp / expected)));
    CHECK(contains(resumed.log, "trace    " + (tmp / expected)));
    CHECK(fs::file_size(tmp / expected) > 0);
    CHECK(read_bytes(trace) == first_trace);
    fs::remove_all(tessera::train::checkpoint_path(tmp / "r", 6));
    fs::remove_all(tessera::train::checkpoint_path(tmp / "r", 4));
  }
  CHECK(tessera::train::resumed_trace_path("/x/trace", 7) == "/x/trace.from-step-7");
}

TEST_CASE("file safety: path problems are found before step 1, not at the save or the export") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt";
  write_bytes(corpus, corpus_text());
  // A regular file and a dangling link named like a step directory.
  for (const bool link : {false, true}) {
    const std::string root = tmp / (link ? "r-link" : "r-file");
    fs::create_directories(root);
    const std::string entry = tessera::train::checkpoint_path(root, 3);
    if (link) {
      fs::create_symlink("nowhere", entry);
    } else {
      write_bytes(entry, "mine");
    }
    TrainConfig config = config_reading(corpus);
    config.ckpt_dir = root;
    config.ckpt_every = 3;
    const Outcome refused = run(config);
    CHECK(contains(refused.error, "named like checkpoints that are not directories (a file, or a symbolic link): " +
                                      entry));
    CHECK_FALSE(trained_a_step(refused));
    CHECK(fs::symlink_status(entry).type() == (link ? fs::file_type::symlink : fs::file_type::regular));
  }
  // A leftover directory where the export is written first.
  fs::create_directories(tmp / "model.safetensors.tmp");
  TrainConfig config = config_reading(corpus);
  config.export_path = tmp / "model.safetensors";
  const Outcome refused = run(config);
  CHECK(contains(refused.error, "--export " + (tmp / "model.safetensors") + ": " + (tmp / "model.safetensors.tmp") +
                                    " exists and is not a regular file"));
  CHECK_FALSE(trained_a_step(refused));
  // A leftover file there is an interrupted export: replaced, and said so.
  fs::remove(tmp / "model.safetensors.tmp");
  write_bytes(tmp / "model.safetensors.tmp", "half an export");
  config.steps = 2;
  const Outcome replaced = run(config);
  REQUIRE(replaced.error.empty());
  CHECK(contains(replaced.log, (tmp / "model.safetensors.tmp") + " (an interrupted export) will be replaced"));
  CHECK_FALSE(fs::exists(tmp / "model.safetensors.tmp"));
  CHECK(fs::file_size(tmp / "model.safetensors") > 1000);
}

TEST_CASE("file safety: a crash while the first launch claimed the root does not block the run forever") {
  TempDir tmp;
  const std::string corpus = tmp / "c.txt";
  write_bytes(corpus, corpus_text());
  fs::create_directories(tmp / "r");
  write_bytes(tmp / "r/run.json.tmp", "{\"format\": \"tessera.r");  // the crash's leftover, and nothing else
  TrainConfig config = config_reading(corpus);
  config.ckpt_dir = tmp / "r";
  config.resume = true;
  config.steps = 2;
  const Outcome resumed = run(config);
  REQUIRE(resumed.error.empty());
  CHECK(contains(resumed.log, "removed " + (tmp / "r/run.json.tmp") + " (a launch that died while claiming the root)"));
  CHECK(tessera::train::list_checkpoints(tmp / "r").size() == 1);
}

TEST_CASE("file safety: disk space: the checkpoints that coexist and the export must fit before step 1") {
  TrainConfig config = config_reading(tessera::train::kSyntheticData);
  config.ckpt_dir = "/ckpt";
  config.steps = 10;
  config.ckpt_every = 3;  // saves at 3, 6, 9 and 10
  CHECK(tessera::train::checkpoints_saved(config, 0) == 4);
  CHECK(tessera::train::checkpoints_saved(config, 6) == 2);
  CHECK(tessera::train::checkpoints_saved(config, 10) == 0);
  config.ckpt_every = 5;  // 5 and 10: the last is a periodic one
  CHECK(tessera::train::checkpoints_saved(config, 0) == 2);
  config.ckpt_every = 3;
  CHECK(tessera::train::checkpoints_added_at_peak(config, 0, 0) == 4);  // --keep 0 keeps all
  config.keep = 1;
  CHECK(tessera::train::checkpoints_added_at_peak(config, 0, 0) == 2);  // the kept one and the one being saved
  CHECK(tessera::train::checkpoints_added_at_peak(config, 3, 1) == 1);  // a resume next to its one checkpoint
  config.keep = 3;
  CHECK(tessera::train::checkpoints_added_at_peak(config, 3, 1) == 3);
  CHECK(tessera::train::checkpoints_added_at_peak(config, 3, 5) == 1);  // more than --keep already: one at a time

  const int64_t each = tessera::train::checkpoint_bytes_bound(config);
  config.keep = 1;
  config.export_path = "/export/m.safetensors";
  const int64_t exported = tessera::train::export_bytes_bound(config);
  const auto one_filesystem = [](int64_t free_bytes) {
    return [free_bytes](const std::string&) { return std::optional<tessera::train::FilesystemSpace>({7, free_bytes}); };
  };
  CHECK_NOTHROW(tessera::train::check_disk_space(config, 0, 0, one_filesystem(2 * each + exported)));
  CHECK_THROWS_WITH_AS(tessera::train::check_disk_space(config, 0, 0, one_filesystem(2 * each + exported - 1)),
                       doctest::Contains("not enough disk space: --ckpt-dir /ckpt: 2 checkpoints of up to"),
                       tessera::Error);
  CHECK_THROWS_WITH_AS(tessera::train::check_disk_space(config, 0, 0, one_filesystem(2 * each + exported - 1)),
                       doctest::Contains("(--keep 1 plus the one being saved)"), tessera::Error);
  CHECK_THROWS_WITH_AS(tessera::train::check_disk_space(config, 0, 0, one_filesystem(2 * each + exported - 1)),
                       doctest::Contains("--export /export/m.safetensors: the exported model"), tessera::Error);
  // Two filesystems: each need on its own.
  const auto split = [&](const std::string& path) {
    const bool exports = path.starts_with("/export");
    return std::optional<tessera::train::FilesystemSpace>({exports ? 2u : 1u, exports ? exported : 2 * each});
  };
  CHECK_NOTHROW(tessera::train::check_disk_space(config, 0, 0, split));
}

TEST_CASE("file safety: the size bounds hold real checkpoints and exports, and are not wasteful") {
  TempDir tmp;
  for (const int nproc : {1, 3}) {
    INFO("nproc " << nproc);
    TrainConfig config = config_reading(tessera::train::kSyntheticData);
    config.nproc = nproc;
    config.steps = 1;
    config.warmup = 0;
    config.ckpt_dir = tmp / fmt::format("r{}", nproc);
    config.export_path = tmp / fmt::format("m{}.safetensors", nproc);
    const Outcome trained = run(config);
    INFO(trained.error);
    REQUIRE(trained.error.empty());
    int64_t checkpoint_bytes = 0;
    for (const auto& entry : fs::recursive_directory_iterator(tessera::train::checkpoint_path(config.ckpt_dir, 1))) {
      if (entry.is_regular_file()) checkpoint_bytes += static_cast<int64_t>(entry.file_size());
    }
    const int64_t export_bytes = static_cast<int64_t>(fs::file_size(config.export_path));
    const int64_t checkpoint_bound = tessera::train::checkpoint_bytes_bound(config);
    const int64_t export_bound = tessera::train::export_bytes_bound(config);
    MESSAGE("nproc " << nproc << ": checkpoint " << checkpoint_bytes << " B, bound " << checkpoint_bound
                     << " B; export " << export_bytes << " B, bound " << export_bound << " B");
    CHECK(checkpoint_bytes <= checkpoint_bound);
    CHECK(checkpoint_bound <= 2 * checkpoint_bytes + (64 << 10));
    CHECK(export_bytes <= export_bound);
    CHECK(export_bound <= 2 * export_bytes + (32 << 10));
  }
}

TEST_CASE("file safety: empty paths, unbounded sizes and the dist timeout are refused with the allowed range") {
  const auto parse = [](std::vector<std::string> flags) {
    std::vector<const char*> argv = {"train"};
    for (const std::string& flag : flags) argv.push_back(flag.c_str());
    TrainConfig config;
    std::ostringstream out, err;
    const std::optional<int> code =
        tessera::train::parse_command_line(static_cast<int>(argv.size()), argv.data(), config, out, err);
    return std::pair{code.value_or(-1), out.str() + err.str()};
  };
  for (const char* flag : {"--ckpt-dir", "--export", "--log-json", "--trace", "--data", "--init-from"}) {
    const auto [code, message] = parse({flag, ""});
    CHECK(code == tessera::train::kUsageExitCode);
    CHECK(contains(message, std::string(flag) + ": must name a file or directory, got an empty path"));
  }
  const auto [code, message] = parse({"--grad-accum", "9223372036854775807"});
  CHECK(code == tessera::train::kUsageExitCode);
  CHECK(contains(message, "--grad-accum: must be in [1, 65536], got 9223372036854775807"));
  CHECK(parse({"--steps", "1e99"}).second.find("--steps: '1e99' is not an integer") != std::string::npos);
  CHECK(parse({"--no-such-flag"}).first == tessera::train::kUsageExitCode);
  for (const char* seed : {"-1", "18446744073709551616", "0x10", "1.5"}) {  // CLI11 alone wraps or saturates some
    CHECK(contains(parse({"--seed", seed}).second, std::string("--seed: must be an integer in [0, "
                                                               "18446744073709551615], got ") + seed));
  }
  CHECK(parse({"--seed", "18446744073709551615"}).first == -1);  // parsed, training would go on
  CHECK(parse({"--batch", "0"}).first == tessera::train::kUsageExitCode);
  CHECK(parse({"--help"}).first == 0);

  TrainConfig huge = config_reading(tessera::train::kSyntheticData);
  huge.grad_accum = int64_t{1} << 40;  // a config built in code is held to the same bounds
  CHECK_THROWS_WITH_AS(huge.validate(), doctest::Contains("--grad-accum must be in [1, 65536]"), tessera::Error);
  huge.grad_accum = 65536;
  huge.batch = 1 << 20;
  huge.nproc = 1 << 20;
  CHECK_THROWS_WITH_AS(huge.validate(), doctest::Contains("lower --grad-accum or --batch"), tessera::Error);

  for (const char* value : {"inf", "1e10", "1e30", "0", "-1", "nan", "5s"}) {
    ::setenv("TESSERA_DIST_TIMEOUT_S", value, 1);
    TrainConfig config = config_reading(tessera::train::kSyntheticData);
    const Outcome refused = run(config);
    CHECK(refused.usage_error);
    CHECK(contains(refused.error, std::string("TESSERA_DIST_TIMEOUT_S: expected seconds in [0.001, 604800] (a week), "
                                              "got '") + value + "'"));
  }
  ::setenv("TESSERA_DIST_TIMEOUT_S", "0.5", 1);
  CHECK(tessera::dist::ProcessGroupOptions::from_environment().timeout == std::chrono::milliseconds(500));
  ::unsetenv("TESSERA_DIST_TIMEOUT_S");
}

TEST_CASE("file safety: a stop request cuts a step short between micro-batches; nothing of it is applied") {
  TrainConfig config = config_reading(tessera::train::kSyntheticData);
  config.grad_accum = 3;
  tessera::train::Trainer trainer(config, tessera::train::build_data(config));
  trainer.train_step();  // step 1 finishes
  const nlohmann::json before = trainer.training_state();
  std::vector<float> weights_before = std::get<tessera::Tensor>(trainer.state_dict().at("model.blocks.0.mlp.fc.weight"))
                                          .to_vector<float>();
  {
    const tessera::train::GracefulStop graceful_stop;
    std::raise(SIGTERM);  // before step 2: seen after its first micro-batch
    const tessera::train::StepMetrics metrics = trainer.train_step();
    CHECK(metrics.stop_signal == SIGTERM);
    REQUIRE(metrics.interrupted_after_micro_batches.has_value());
    CHECK(*metrics.interrupted_after_micro_batches == 1);
    CHECK(metrics.step == 1);
  }
  CHECK(trainer.steps_done() == 1);
  CHECK(trainer.training_state()["step"] == before["step"]);
  CHECK(trainer.training_state()["data"] == before["data"]);
  CHECK(std::get<tessera::Tensor>(trainer.state_dict().at("model.blocks.0.mlp.fc.weight")).to_vector<float>() ==
        weights_before);
  CHECK_THROWS_WITH_AS(trainer.train_step(), doctest::Contains("was cut short by a stop request"), tessera::Error);
}

TEST_CASE("file safety: a SIGTERM during a step of 65536 micro-batches stops the run within one of them") {
  TempDir tmp;
  TrainConfig config = config_reading(tessera::train::kSyntheticData);
  config.nproc = 2;
  config.batch = 1;
  config.grad_accum = 65536;  // minutes per step: only a stop between micro-batches ends it
  config.ckpt_dir = tmp / "r";
  Outcome stopped;
  {
    const tessera::train::GracefulStop graceful_stop;
    std::thread signaller([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::raise(SIGTERM);
    });
    stopped = run(config);
    signaller.join();
  }
  REQUIRE(stopped.error.empty());
  CHECK(stopped.summary.stop_signal == SIGTERM);
  CHECK(stopped.summary.losses.empty());
  CHECK(contains(stopped.log, "stopped  on SIGTERM during step 1 of 6, after "));
  CHECK(contains(stopped.log, "of its 65536 micro-batches (the step was dropped; a resume redoes it): no step "
                              "finished, so nothing was saved"));
  CHECK(tessera::train::list_checkpoints(tmp / "r").empty());
}

// ---- a real full disk: a tmpfs mounted by check_disk_full.sh in a private mount namespace ----

namespace {

// The tmpfs the script mounted (TESSERA_TEST_TMPFS), empty for each case.
std::string small_filesystem() {
  const char* mount = std::getenv("TESSERA_TEST_TMPFS");
  REQUIRE_MESSAGE(mount != nullptr, "run through tests/train/check_disk_full.sh, which mounts the tmpfs");
  for (const auto& entry : fs::directory_iterator(mount)) fs::remove_all(entry.path());
  return mount;
}

int64_t free_bytes(const std::string& path) { return tessera::train::filesystem_space(path)->free_bytes; }

}  // namespace

TEST_CASE("disk full: a filesystem too small for the run's checkpoints is refused before step 1" * doctest::skip()) {
  const std::string mount = small_filesystem();
  TrainConfig config = config_reading(tessera::train::kSyntheticData);
  config.model = tessera::nn::GPTConfig::preset("tiny");  // checkpoints larger than the filesystem
  config.seq_len = 16;
  config.ckpt_dir = mount + "/r";
  config.ckpt_every = 1;  // six checkpoints, all kept
  REQUIRE(6 * tessera::train::checkpoint_bytes_bound(config) > free_bytes(mount));
  const Outcome refused = run(config);
  CHECK(refused.usage_error);
  CHECK(contains(refused.error, "not enough disk space: --ckpt-dir " + mount + "/r: 6 checkpoints of up to"));
  CHECK(contains(refused.error, "at once (all kept (--keep 0))"));
  CHECK_FALSE(trained_a_step(refused));
  CHECK_FALSE(fs::exists(mount + "/r"));  // nothing was written
}

TEST_CASE("disk full: a save that runs out of space removes its partial files and stops; --resume goes on" *
          doctest::skip()) {
  const std::string mount = small_filesystem();
  TrainConfig config = config_reading(tessera::train::kSyntheticData);
  config.ckpt_dir = mount + "/r";
  config.ckpt_every = 2;
  config.keep = 1;
  config.log_json = mount + "/log.jsonl";
  const int64_t each = tessera::train::checkpoint_bytes_bound(config);
  REQUIRE(2 * each < free_bytes(mount));
  // Once step 2 is committed, something else fills the disk: step 4's save has half a checkpoint's room.
  const std::string filler = mount + "/filler";
  checkpoint::set_save_point_observer([&](std::string_view point) {
    if (point != "committed" || fs::exists(filler)) return;
    const int64_t fill = free_bytes(mount) - each / 2;
    std::ofstream(filler, std::ios::binary) << std::string(static_cast<size_t>(std::max<int64_t>(fill, 0)), '\0');
  });
  const Outcome failed = run(config);
  checkpoint::set_save_point_observer({});
  CHECK_FALSE(failed.usage_error);
  CHECK(contains(failed.error, "saving a checkpoint failed"));
  CHECK(contains(failed.error, "No space left on device"));
  CHECK(contains(failed.error, "Its partial files were removed; " + tessera::train::checkpoint_path(config.ckpt_dir, 2) +
                                   " (step 2) is this run's newest checkpoint, intact. Make space"));
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(config.ckpt_dir)) entries.push_back(entry.path().filename().string());
  std::sort(entries.begin(), entries.end());
  CHECK(entries == std::vector<std::string>{".lock", "run.json", "step-00000002"});

  fs::remove(filler);
  TrainConfig resume = config;
  resume.resume = true;
  const Outcome resumed = run(resume);
  REQUIRE(resumed.error.empty());
  CHECK(resumed.summary.first_step == 3);
  CHECK(logged_steps(config.log_json) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(tessera::train::list_checkpoints(config.ckpt_dir).back().step == 6);
}
