// `train` never loses a run: each failure the issue found, now refused before
// the first step with a message naming the flag and the path (another run's
// checkpoint root, a root already holding this run's checkpoints, a torn step
// directory, an unwritable export, log or trace, a changed metadata.json),
// resume printing what it really uses, a changed --data refused unless
// allowed, non-finite state never saved, and a SIGTERM ending the run after
// the step in progress with a checkpoint that resumes bitwise.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/metadata.h"
#include "checkpoint/sealed_json.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/train_outcome.h"
#include "train/checkpoint_manager.h"
#include "train/graceful_stop.h"
#include "train/run_record.h"
#include "train/trainer.h"
#include "train/training_run.h"

namespace fs = std::filesystem;
namespace checkpoint = tessera::checkpoint;
using tessera::train::TrainConfig;
using tessera::train::testing::Outcome;
using tessera::train::testing::run;
using tessera::train::testing::trained_a_step;
using tessera::checkpoint::testing::TempDir;

namespace {

TrainConfig quick_config(const std::string& ckpt_dir) {
  TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("nano");
  config.data = tessera::train::kSyntheticData;
  config.seq_len = 16;
  config.batch = 4;
  config.steps = 6;
  config.warmup = 2;
  config.eval_every = 0;
  config.ckpt_dir = ckpt_dir;
  return config;
}


std::vector<int64_t> steps_in(const std::string& root) {
  std::vector<int64_t> steps;
  for (const auto& entry : tessera::train::list_checkpoints(root)) steps.push_back(entry.step);
  return steps;
}

}  // namespace

TEST_CASE("run safety: --keep in another run's root deletes nothing; the run is refused before its first step") {
  TempDir tmp;
  const std::string root = tmp / "D";
  REQUIRE(run(quick_config(root)).error.empty());  // steps 1-6, saved at 6
  TrainConfig other = quick_config(root);
  other.steps = 5;
  other.keep = 1;
  other.seed = 42;
  const Outcome refused = run(other);
  CHECK(refused.error.find("--ckpt-dir " + root) != std::string::npos);
  CHECK(refused.error.find("seed: the run's 1337, this launch's 42") != std::string::npos);
  CHECK(!trained_a_step(refused));
  CHECK(steps_in(root) == std::vector<int64_t>{6});
}

TEST_CASE("run safety: a fresh run into a root with this run's checkpoints, or a torn step, is refused up front") {
  TempDir tmp;
  const std::string root = tmp / "D";
  REQUIRE(run(quick_config(root)).error.empty());
  for (const int64_t every : {0, 2}) {
    TrainConfig again = quick_config(root);
    again.ckpt_every = every;
    const Outcome refused = run(again);
    CHECK(refused.error.find("already holds this run's checkpoints") != std::string::npos);
    CHECK(refused.error.find("To continue the run saved there, pass --resume") != std::string::npos);
    CHECK(!trained_a_step(refused));
  }
  // A step directory without metadata.json (copied in by hand), for a fresh run and a resume alike.
  fs::create_directories(tmp / "torn");
  const Outcome fresh = run(quick_config(tmp / "torn"));  // creates run.json
  REQUIRE(fresh.error.empty());
  fs::create_directories(tessera::train::checkpoint_path(tmp / "torn", 9));
  TrainConfig resume = quick_config(tmp / "torn");
  resume.resume = true;
  const Outcome torn = run(resume);
  CHECK(torn.error.find(tessera::train::checkpoint_path(tmp / "torn", 9)) != std::string::npos);
  CHECK(torn.error.find("without metadata.json") != std::string::npos);
  CHECK(!trained_a_step(torn));
}

TEST_CASE("run safety: every destination is proven writable before the first step") {
  TempDir tmp;
  struct Case {
    const char* what;
    std::function<void(TrainConfig&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"export into a missing directory", [](TrainConfig& c) { c.export_path = "/nonexistent/x.safetensors"; },
       "--export /nonexistent/x.safetensors: the directory /nonexistent does not exist"},
      {"export onto a directory", [&](TrainConfig& c) { c.export_path = tmp.path.string(); }, "is a directory"},
      {"trace into a missing directory", [](TrainConfig& c) { c.trace = "/nonexistent/trace.json"; },
       "--trace /nonexistent/trace.json: the directory /nonexistent does not exist"},
      {"log into a missing directory", [](TrainConfig& c) { c.log_json = "/nonexistent/log.jsonl"; },
       "--log-json /nonexistent/log.jsonl: the directory /nonexistent does not exist"},
      // /proc refuses new entries even to root, where permission bits would not.
      {"checkpoints where nothing can be created", [](TrainConfig& c) { c.ckpt_dir = "/proc/self/ckpt"; },
       "--ckpt-dir /proc/self/ckpt"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    TrainConfig config = quick_config("");
    config.nproc = 2;
    c.set(config);
    const Outcome refused = run(config);
    INFO(refused.error);
    CHECK(refused.error.find(c.message) != std::string::npos);
    CHECK(!trained_a_step(refused));
  }
}

TEST_CASE("run safety: a changed metadata.json is named, never resumed from") {
  TempDir tmp;
  const std::string root = tmp / "D";
  TrainConfig config = quick_config(root);
  config.steps = 4;
  REQUIRE(run(config).error.empty());
  const std::string metadata = fs::path(tessera::train::checkpoint_path(root, 4)) / checkpoint::kMetadataFile;
  std::string text = [&] {
    std::ifstream in(metadata);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // The edit: "step": 4 -> 5 in the training state.
  const size_t at = text.find("\"step\": 4", text.find("\"training_state\""));
  REQUIRE(at != std::string::npos);
  text[at + 8] = '5';
  std::ofstream(metadata, std::ios::trunc) << text;
  TrainConfig resume = config;
  resume.steps = 6;
  resume.resume = true;
  const Outcome refused = run(resume);
  CHECK(refused.error.find(metadata + ": checksum mismatch") != std::string::npos);
  CHECK(!trained_a_step(refused));

  // Resealed by hand: the seal holds, but the training state's step is not the checkpoint's.
  nlohmann::ordered_json resealed = nlohmann::ordered_json::parse(text);
  resealed.erase("crc32c");
  std::ofstream(metadata, std::ios::trunc) << checkpoint::seal_json(resealed);
  const Outcome contradicted = run(resume);
  CHECK(contradicted.error.find("the training state is at step 5, the checkpoint's metadata at step 4") !=
        std::string::npos);
  CHECK(!trained_a_step(contradicted));
}

TEST_CASE("run safety: --resume prints the settings it really uses and which flags the checkpoint overrides") {
  TempDir tmp;
  const std::string root = tmp / "D";
  TrainConfig config = quick_config(root);
  config.ckpt_every = 3;
  config.lr = 3e-3;
  REQUIRE(run(config).error.empty());
  fs::remove_all(tessera::train::checkpoint_path(root, 6));  // as if stopped after step 3

  TrainConfig resume = config;
  resume.resume = true;
  resume.lr = 1e-2;
  resume.steps = 8;
  resume.warmup = 4;
  const Outcome resumed = run(resume);
  REQUIRE(resumed.error.empty());
  CHECK(resumed.log.find("resume   the checkpoint's settings replace the command line's: --lr 0.01 -> 0.003, "
                         "--warmup 4 -> 2, --steps 8 -> 6") != std::string::npos);
  CHECK(resumed.log.find("AdamW lr 0.003 (warmup 2") != std::string::npos);  // the banner shows what runs
  CHECK(resumed.log.find("AdamW lr 0.01") == std::string::npos);
  CHECK(resumed.summary.first_step == 4);
  CHECK(resumed.summary.losses.size() == 3);
}

TEST_CASE("run safety: other --data is refused on resume unless --allow-data-change, which run.json records") {
  TempDir tmp;
  const std::string first = tmp / "a.txt", second = tmp / "b.txt";
  std::ofstream(first) << std::string(4000, 'a') + "the quick brown fox jumps over the lazy dog\n";
  std::ofstream(second) << std::string(4000, 'b') + "pack my box with five dozen liquor jugs\n";
  TrainConfig config = quick_config(tmp / "D");
  config.data = first;
  config.steps = 4;
  config.ckpt_every = 2;
  REQUIRE(run(config).error.empty());
  fs::remove_all(tessera::train::checkpoint_path(tmp / "D", 4));  // as if stopped after step 2

  TrainConfig other = config;
  other.data = second;
  other.resume = true;
  const Outcome refused = run(other);
  CHECK(refused.error.find("data: the run's") != std::string::npos);
  CHECK(refused.error.find("--allow-data-change permits other data") != std::string::npos);
  CHECK(!trained_a_step(refused));

  other.allow_data_change = true;
  const Outcome allowed = run(other);
  REQUIRE(allowed.error.empty());
  CHECK(allowed.log.find("identity amended at step 2") != std::string::npos);
  const tessera::train::RunRecord record = tessera::train::RunRecord::read(tmp / "D/run.json");
  REQUIRE(record.amendments.size() == 1);
  CHECK(record.amendments[0]["key"] == "data");
  CHECK(record.amendments[0]["to"]["source"].get<std::string>().find("b.txt") != std::string::npos);
  CHECK(allowed.summary.first_step == 3);
  CHECK(steps_in(tmp / "D") == std::vector<int64_t>{2, 4});
}

TEST_CASE("run safety: non-finite state is never saved; the step and the quantity are named") {
  TempDir tmp;
  // lr 1e30 makes step 1's update ~1e30 (still finite, saved); step 2's
  // forward overflows, and the run stops before step 2 could be saved.
  TrainConfig config = quick_config(tmp / "D");
  config.lr = 1e30;
  config.warmup = 0;
  config.ckpt_every = 1;
  const Outcome diverged = run(config);
  CHECK(diverged.error.find("train: step 2: the loss is") != std::string::npos);
  CHECK(steps_in(tmp / "D") == std::vector<int64_t>{1});

  // A NaN in one rank's shard stops every rank before a save, naming the tensor and the rank.
  TrainConfig two = quick_config("");
  two.nproc = 2;
  std::vector<std::string> errors(2);
  tessera::train::init_distributed(two, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(two, tessera::train::build_data(two), distributed);
    trainer.train_step();
    if (distributed.rank() == 1) {
      tessera::Tensor shard = std::get<tessera::dist::DTensor>(trainer.state_dict().at("model.blocks.0.mlp.fc.weight")).local();
      tessera::ops::fill_(shard, std::nan(""));
    }
    try {
      trainer.require_finite_state();
    } catch (const tessera::Error& error) {
      errors[static_cast<size_t>(distributed.rank())] = error.what();
    }
  });
  for (const std::string& error : errors) {
    CHECK(error.find("model.blocks.0.mlp.fc.weight holds NaN or infinite values (rank 1's shard)") !=
          std::string::npos);
  }
}

TEST_CASE("run safety: a SIGTERM ends the run after the step in progress, saved, and --resume continues bitwise") {
  TempDir tmp;
  TrainConfig config = quick_config(tmp / "whole");
  config.nproc = 2;
  config.deterministic = true;
  config.model.dropout = 0.1;  // the RNG state must carry over too
  const Outcome uninterrupted = run(config);
  REQUIRE(uninterrupted.error.empty());
  REQUIRE(uninterrupted.summary.losses.size() == 6);

  TrainConfig stopped_config = config;
  stopped_config.ckpt_dir = tmp / "stopped";
  Outcome stopped;
  {
    const tessera::train::GracefulStop graceful_stop;
    std::raise(SIGTERM);  // arrives before step 1 ends: the run stops after step 1
    CHECK(tessera::train::GracefulStop::requested() == SIGTERM);
    stopped = run(stopped_config);
  }
  REQUIRE(stopped.error.empty());
  CHECK(stopped.summary.stop_signal == SIGTERM);
  CHECK(stopped.summary.losses.size() == 1);
  CHECK(stopped.log.find("stopped  on SIGTERM after step 1 of 6: " +
                         tessera::train::checkpoint_path(tmp / "stopped", 1) + " committed; continue with --resume") !=
        std::string::npos);
  CHECK(steps_in(tmp / "stopped") == std::vector<int64_t>{1});
  CHECK(tessera::train::GracefulStop::requested() == 0);  // uninstalled: the next run is not stopped

  TrainConfig resume = stopped_config;
  resume.resume = true;
  const Outcome resumed = run(resume);
  REQUIRE(resumed.error.empty());
  REQUIRE(resumed.summary.losses.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(resumed.summary.losses[i] == uninterrupted.summary.losses[i + 1]);
}

TEST_CASE("run safety: a repeated SIGTERM, SIGHUP or SIGUSR1 leaves the first stop request in place") {
  // Schedulers and launchers repeat them (graceful_stop.h): the process lives
  // on to save, and the first signal is the one the run reports.
  const tessera::train::GracefulStop graceful_stop;
  std::raise(SIGUSR1);
  for (const int signal : {SIGTERM, SIGHUP, SIGUSR1, SIGTERM}) std::raise(signal);
  CHECK(tessera::train::GracefulStop::requested() == SIGUSR1);
  CHECK(std::string(tessera::train::signal_name(SIGUSR1)) == "SIGUSR1");
}
