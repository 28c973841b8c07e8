// An input that is a FIFO is refused by name, never waited on (issue 48):
// `--init-from` a FIFO, or a Hugging Face directory whose config.json or
// shard is one, used to block in open(), where even SIGTERM could not end
// the run. A watchdog opens each FIFO for writing after a long while, so a
// regression fails the test instead of hanging it.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "checkpoint/file_io.h"
#include "tensor/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/train_outcome.h"
#include "train/flag_checks.h"
#include "train/model_loader.h"
#include "train/train_config.h"

namespace fs = std::filesystem;
using tessera::checkpoint::testing::TempDir;
using tessera::train::testing::parse_flags;

namespace {

const fs::path kGoldenGpt2 = fs::path(TESSERA_HF_GOLDEN_DIR) / "gpt2";

// Releases a reader blocked in open() on `fifo` once `patience` has passed,
// and says whether it had to.
class FifoWatchdog {
 public:
  explicit FifoWatchdog(std::string fifo, std::chrono::seconds patience = std::chrono::seconds(300))
      : thread_([this, fifo = std::move(fifo), patience] {
          const auto deadline = std::chrono::steady_clock::now() + patience;
          while (!done_ && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          if (done_) return;
          fired_ = true;
          const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO when nobody reads: harmless
          if (fd >= 0) ::close(fd);
        }) {}
  ~FifoWatchdog() { stop(); }
  // Whether a reader had to be released.
  bool stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::atomic<bool> done_{false};
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

void make_fifo(const std::string& path) { REQUIRE(::mkfifo(path.c_str(), 0644) == 0); }

// A copy of the golden GPT-2 directory with `fifo_name` replaced by a FIFO.
std::string hf_dir_with_fifo(const TempDir& tmp, const std::string& fifo_name) {
  const std::string dir = tmp / ("hf-" + fifo_name);
  fs::copy(kGoldenGpt2, dir);
  fs::remove(fs::path(dir) / fifo_name);
  make_fifo((fs::path(dir) / fifo_name).string());
  return dir;
}

}  // namespace

TEST_CASE("fifo inputs: a FIFO where a file is read is refused by its type at once") {
  TempDir tmp;
  const std::string fifo = tmp / "model.safetensors";
  make_fifo(fifo);
  FifoWatchdog watchdog(fifo);
  CHECK_THROWS_WITH_AS(tessera::checkpoint::ReadFile{fifo},
                       doctest::Contains((fifo + ": a FIFO, not a regular file").c_str()), tessera::Error);
  CHECK_THROWS_WITH_AS(tessera::checkpoint::read_file_text(tmp.path.string()),
                       doctest::Contains("a directory, not a regular file"), tessera::Error);
  CHECK_FALSE(watchdog.stop());
}

TEST_CASE("fifo inputs: train --init-from a FIFO, generate's loader too, fail naming it") {
  TempDir tmp;
  const std::string fifo = tmp / "weights.safetensors";
  make_fifo(fifo);
  FifoWatchdog watchdog(fifo);
  tessera::train::TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("nano");
  config.data = tessera::train::kSyntheticData;
  config.steps = 1;
  config.warmup = 0;
  config.batch = 2;
  config.seq_len = 16;
  config.init_from = fifo;
  const tessera::train::testing::Outcome refused = tessera::train::testing::run(config);
  INFO(refused.error);
  CHECK(refused.error.find(fifo + ": a FIFO, not a regular file") != std::string::npos);
  CHECK_FALSE(tessera::train::testing::trained_a_step(refused));
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_export(fifo), doctest::Contains("a FIFO"), tessera::Error);
  CHECK_FALSE(watchdog.stop());
}

TEST_CASE("fifo inputs: a Hugging Face directory whose config.json or shard is a FIFO is refused") {
  TempDir tmp;
  const std::string config_fifo = hf_dir_with_fifo(tmp, "config.json");
  const std::string shard_fifo = hf_dir_with_fifo(tmp, "model.safetensors");
  FifoWatchdog config_watchdog((fs::path(config_fifo) / "config.json").string());
  FifoWatchdog shard_watchdog((fs::path(shard_fifo) / "model.safetensors").string());

  // train reads config.json while parsing its flags (the model comes from it): a usage error.
  tessera::train::TrainConfig parsed;
  std::string err;
  CHECK(parse_flags({"--init-from", config_fifo.c_str()}, parsed, err) == tessera::train::kUsageExitCode);
  CHECK(err.find("config.json: a FIFO, not a regular file") != std::string::npos);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_export(config_fifo),
                       doctest::Contains("config.json: a FIFO"), tessera::Error);

  // The shard is read once the run has started.
  tessera::train::TrainConfig config;
  REQUIRE_FALSE(parse_flags({"--init-from", shard_fifo.c_str(), "--data", "synthetic", "--steps", "1", "--batch", "2",
                             "--seq-len", "16"},
                            config, err)
                    .has_value());
  const tessera::train::testing::Outcome refused = tessera::train::testing::run(config);
  INFO(refused.error);
  CHECK(refused.error.find("model.safetensors: a FIFO, not a regular file") != std::string::npos);
  CHECK_FALSE(tessera::train::testing::trained_a_step(refused));
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_export(shard_fifo),
                       doctest::Contains("model.safetensors: a FIFO"), tessera::Error);
  CHECK_FALSE(config_watchdog.stop());
  CHECK_FALSE(shard_watchdog.stop());
}
