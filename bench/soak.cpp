// bench/soak: the tiny GPT trained to the end through seeded random faults
// (dist/launch/fault_injection.h), resumed after each, on thread ranks with async
// checkpoints; its final weights must be bitwise those of the run that met
// no fault. Each attempt carries one fault that stops it (a rank killed at a
// collective, a shard write failing with ENOSPC, a death before a commit)
// and, one time in two, a delay at an earlier collective. What an attempt
// ends in must be the fault it carried; anything else (another error, a
// finish the fault should have stopped) fails the soak. Prints the count of
// each kind and the time it cost: the wall time of the steps the next
// attempt has to redo, and the delays themselves.
//
//   build/bench/soak [--steps 1000] [--faults 24] [--ranks 4] [--ckpt-every 10] [--seed 1]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <unistd.h>

#include "dist/launch/fault_injection.h"
#include "train/checkpoint_manager.h"
#include "train/training_run.h"

namespace fs = std::filesystem;
namespace dist = tessera::dist;

namespace {

struct Options {
  int64_t steps = 1000;
  int faults = 24;
  int ranks = 4;
  int64_t ckpt_every = 10;
  uint64_t seed = 1;
};

tessera::train::TrainConfig soak_config(const Options& options, const fs::path& root) {
  fs::create_directories(root);
  tessera::train::TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("tiny");
  config.model.vocab_size = 97;
  config.data = tessera::train::kSyntheticData;
  config.seq_len = 16;
  config.batch = 2;
  config.nproc = options.ranks;
  config.threads = 1;
  config.steps = options.steps;
  config.warmup = 10;
  config.eval_every = 0;
  config.deterministic = true;
  config.ckpt_dir = (root / "ckpt").string();
  config.ckpt_every = options.ckpt_every;
  config.async_ckpt = true;
  config.keep = 2;
  config.export_path = (root / "model.safetensors").string();
  return config;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

int64_t last_committed_step(const std::string& root) {
  const std::optional<tessera::train::CheckpointEntry> latest = tessera::train::latest_checkpoint(root);
  return latest ? latest->step : 0;
}

// The last step an attempt's log reports ("step    37 | loss ...").
int64_t last_logged_step(const std::string& log) {
  int64_t last = 0;
  std::istringstream lines(log);
  std::string word;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    int64_t step = 0;
    if (fields >> word && word == "step" && fields >> step) last = step;
  }
  return last;
}

// One attempt's faults: the one that stops it, and perhaps a delay first.
struct AttemptPlan {
  std::string kind;  // "rank killed", "shard write ENOSPC", "death before commit"
  std::vector<dist::Fault> faults;
};

AttemptPlan draw_plan(std::mt19937_64& random, const Options& options) {
  auto uniform = [&](int64_t low, int64_t high) { return std::uniform_int_distribution<int64_t>(low, high)(random); };
  const int rank = static_cast<int>(uniform(0, options.ranks - 1));
  AttemptPlan plan;
  // A step makes a few dozen collectives on the tiny model; a save one shard write a rank.
  switch (uniform(0, 2)) {
    case 0:
      plan.kind = "rank killed";
      plan.faults.push_back(
          dist::parse_faults(fmt::format("kill@collective,rank={},at={}", rank, uniform(40, 800)))[0]);
      break;
    case 1:
      plan.kind = "shard write ENOSPC";
      plan.faults.push_back(
          dist::parse_faults(fmt::format("fail@checkpoint_write,rank={},at={},errno=ENOSPC", rank, uniform(1, 3)))[0]);
      break;
    default:
      plan.kind = "death before commit";
      plan.faults.push_back(dist::parse_faults(fmt::format("kill@checkpoint_commit,at={}", uniform(1, 3)))[0]);
  }
  if (uniform(0, 1) == 1) {
    const double seconds = static_cast<double>(uniform(5, 20)) / 100.0;
    plan.faults.push_back(dist::parse_faults(
        fmt::format("delay@collective,rank={},at={},seconds={}", uniform(0, options.ranks - 1), uniform(1, 30),
                    seconds))[0]);
  }
  return plan;
}

struct Tally {
  int count = 0;
  double seconds_lost = 0.0;
  int64_t steps_redone = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training through seeded random faults, resumed after each, bitwise to the end", "soak"};
  Options options;
  app.add_option("--steps", options.steps, "Optimizer steps of the run")->check(CLI::Range(20, 100000));
  app.add_option("--faults", options.faults, "Attempts that carry a fault")->check(CLI::Range(1, 1000));
  app.add_option("--ranks", options.ranks, "Thread ranks")->check(CLI::Range(1, 16));
  app.add_option("--ckpt-every", options.ckpt_every, "Checkpoint every K steps")->check(CLI::Range(1, 1000));
  app.add_option("--seed", options.seed, "Seed of the faults");
  CLI11_PARSE(app, argc, argv);

  // The runs' checkpoints and exports, removed at the end.
  const fs::path work = fs::temp_directory_path() / fmt::format("tessera-soak-{}", ::getpid());
  struct RemoveAtExit {
    fs::path path;
    ~RemoveAtExit() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_at_exit{work};
  std::ostringstream ignored;
  const auto reference_start = std::chrono::steady_clock::now();
  tessera::train::train(soak_config(options, work / "reference"), ignored);
  const double reference_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - reference_start).count();
  const std::string expected = file_bytes(work / "reference" / "model.safetensors");
  fmt::print("soak: the tiny GPT, {} steps on {} thread ranks, async checkpoints every {}, {} faulty attempts, "
             "seed {}\n",
             options.steps, options.ranks, options.ckpt_every, options.faults, options.seed);
  fmt::print("soak: the run without faults took {:.1f} s\n", reference_seconds);

  tessera::train::TrainConfig config = soak_config(options, work / "soak");
  config.resume = true;  // a root without checkpoints starts the run
  std::mt19937_64 random(options.seed);
  std::map<std::string, Tally> tallies;
  double delays = 0.0;
  int attempts = 0;
  bool finished = false;
  const auto soak_start = std::chrono::steady_clock::now();
  while (!finished) {
    const bool faulty = attempts < options.faults;
    const AttemptPlan plan = faulty ? draw_plan(random, options) : AttemptPlan{"none", {}};
    dist::set_faults(plan.faults);
    const int64_t start_step = last_committed_step(config.ckpt_dir);
    std::ostringstream log;
    const auto start = std::chrono::steady_clock::now();
    std::string failure;
    try {
      tessera::train::train(config, log);
      finished = true;
    } catch (const std::exception& error) {
      failure = error.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++attempts;
    for (const dist::Fault& fault : plan.faults) {
      if (fault.action == dist::FaultAction::delay) delays += fault.seconds;
    }
    if (finished) {
      if (faulty) fmt::print("soak: attempt {} finished the run before its fault ({})\n", attempts, plan.kind);
      break;
    }
    if (!faulty || failure.find("injected fault") == std::string::npos) {
      fmt::print(stderr, "soak: attempt {} ({}) ended in an error no fault explains:\n{}\n", attempts, plan.kind,
                 failure);
      return 1;
    }
    const int64_t reached = last_logged_step(log.str());
    const int64_t kept = last_committed_step(config.ckpt_dir);
    const int64_t run = std::max<int64_t>(1, reached - start_step);
    Tally& tally = tallies[plan.kind];
    ++tally.count;
    tally.steps_redone += reached - kept;
    tally.seconds_lost += seconds * static_cast<double>(reached - kept) / static_cast<double>(run);
  }
  dist::set_faults({});
  const double soak_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - soak_start).count();

  fmt::print("soak: {} attempts in {:.1f} s\n", attempts, soak_seconds);
  fmt::print("  {:<22} {:>6} {:>13} {:>12}\n", "fault", "count", "steps redone", "time lost");
  for (const auto& [kind, tally] : tallies) {
    fmt::print("  {:<22} {:>6} {:>13} {:>10.2f} s\n", kind, tally.count, tally.steps_redone, tally.seconds_lost);
  }
  fmt::print("  {:<22} {:>6} {:>13} {:>10.2f} s\n", "delays", "", "", delays);
  const bool same = file_bytes(config.export_path) == expected;
  fmt::print("soak: final parameters {} the run without faults\n", same ? "bitwise equal to" : "DIFFER from");
  return same ? 0 : 1;
}
