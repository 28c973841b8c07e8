// Injected faults in a training run (dist/launch/fault_injection.h) end in one of
// two ways, never a hang or silent wrong numbers: a clean stop with a clear
// message and a checkpoint that resumes bitwise into the uninterrupted run,
// or a corruption found at load, naming the file. Thread ranks (the local
// backend); tests/train/check_multi_host_failures.sh covers processes.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist/launch/fault_injection.h"
#include "tensor/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "train/checkpoint_manager.h"
#include "train/training_run.h"

namespace fs = std::filesystem;
using tessera::checkpoint::testing::TempDir;

namespace {

struct ClearFaults {
  ~ClearFaults() { tessera::dist::set_faults({}); }
};

// 8 steps of the tiny GPT on 3 ranks, a checkpoint every 2 steps in `root`.
tessera::train::TrainConfig faulty_config(const fs::path& root) {
  tessera::train::TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("tiny");
  config.model.vocab_size = 97;
  config.data = tessera::train::kSyntheticData;
  config.seq_len = 16;
  config.batch = 2;
  config.nproc = 3;
  config.steps = 8;
  config.warmup = 2;
  config.eval_every = 0;
  config.deterministic = true;
  config.ckpt_dir = (root / "ckpt").string();
  config.ckpt_every = 2;
  config.export_path = (root / "model.safetensors").string();
  return config;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// The error that ended a run, or "" when it finished.
std::string failure_of(const tessera::train::TrainConfig& config) {
  std::ostringstream log;
  try {
    tessera::train::train(config, log);
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

// The final export of the same run without faults and without interruption.
std::string uninterrupted_export() {
  TempDir dir;
  const tessera::train::TrainConfig config = faulty_config(dir.path);
  REQUIRE(failure_of(config).empty());
  return file_bytes(config.export_path);
}

std::vector<int64_t> committed_steps(const std::string& root) {
  std::vector<int64_t> steps;
  for (const auto& entry : tessera::train::list_checkpoints(root)) steps.push_back(entry.step);
  return steps;
}

std::vector<std::string> entries_of(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs with the faults of `plan`, which must stop the run with an error that
// says each of `says` and leave no partial save behind; then, without
// faults, the run resumes from what it committed and ends bitwise as the
// uninterrupted run. Returns the steps it had committed.
std::vector<int64_t> stops_then_resumes(const char* plan, const std::vector<std::string>& says) {
  const std::string expected = uninterrupted_export();
  TempDir dir;
  tessera::train::TrainConfig config = faulty_config(dir.path);
  tessera::dist::set_faults(tessera::dist::parse_faults(plan));
  const std::string failure = failure_of(config);
  INFO(failure);
  for (const std::string& part : says) CHECK(failure.find(part) != std::string::npos);
  CHECK(!fs::exists(config.export_path));
  for (const std::string& name : entries_of(config.ckpt_dir)) CHECK(name.find(".tmp") == std::string::npos);
  const std::vector<int64_t> committed = committed_steps(config.ckpt_dir);

  tessera::dist::set_faults({});
  config.resume = true;
  REQUIRE(failure_of(config).empty());
  CHECK(file_bytes(config.export_path) == expected);
  return committed;
}

}  // namespace

TEST_CASE("an injected rank death mid-run stops the run by name; the last checkpoint resumes bitwise") {
  ClearFaults clear;
  const std::vector<int64_t> committed = stops_then_resumes(
      "kill@collective,rank=2,at=90", {"injected fault kill@collective,rank=2,at=90: the rank died at world rank 2's"});
  REQUIRE(!committed.empty());
  CHECK(committed.back() < 8);  // it died mid-run, after a checkpoint
}

TEST_CASE("an injected ENOSPC on one rank's checkpoint write stops the run; the save before resumes bitwise") {
  ClearFaults clear;
  // The failed save at step 4 leaves nothing; step 2's stays.
  CHECK(stops_then_resumes("fail@checkpoint_write,rank=1,at=2,errno=ENOSPC",
                           {"writing rank-00001.safetensors", "No space left on device (ENOSPC)"}) ==
        std::vector<int64_t>{2});
}

TEST_CASE("an injected death before a commit loses that checkpoint only; the one before resumes bitwise") {
  ClearFaults clear;
  CHECK(stops_then_resumes("kill@checkpoint_commit,at=3",
                           {"injected fault kill@checkpoint_commit,at=3: the rank died at the commit of"}) ==
        std::vector<int64_t>{2, 4});
}

TEST_CASE("an injected failure to load a micro-batch stops the run; the last checkpoint resumes bitwise") {
  ClearFaults clear;
  // A micro-batch a step on each of 3 ranks: rank 1's 6th is global micro-batch 5 x 3 + 1, in step 6.
  CHECK(stops_then_resumes("fail@data,rank=1,at=6,errno=EIO",
                           {"data: reading micro-batch 16 of synthetic", "Input/output error (EIO)",
                            "injected fault fail@data,rank=1,at=6,errno=EIO"}) == std::vector<int64_t>{2, 4});
}

TEST_CASE("an injected corruption after the checksum is found at load, naming the file") {
  ClearFaults clear;
  TempDir dir;
  tessera::train::TrainConfig config = faulty_config(dir.path);
  config.steps = 4;
  config.keep = 0;
  tessera::dist::set_faults(tessera::dist::parse_faults("corrupt@checkpoint_write,rank=0,at=2"));
  REQUIRE(failure_of(config).empty());  // the save cannot see it: the bytes rot after their checksum
  tessera::dist::set_faults({});
  config.steps = 8;
  config.resume = true;
  config.export_path.clear();
  const std::string failure = failure_of(config);
  INFO(failure);
  CHECK(failure.find("step-00000004/rank-00000.safetensors") != std::string::npos);
  CHECK(failure.find("do not match their checksum (corrupt file)") != std::string::npos);
}

TEST_CASE("an injected delay shorter than the timeout changes nothing but the time") {
  ClearFaults clear;
  const std::string expected = uninterrupted_export();
  TempDir dir;
  const tessera::train::TrainConfig config = faulty_config(dir.path);
  tessera::dist::set_faults(tessera::dist::parse_faults("delay@collective,rank=1,at=40,seconds=0.3"));
  REQUIRE(failure_of(config).empty());
  CHECK(file_bytes(config.export_path) == expected);
}
