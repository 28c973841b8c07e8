// The GPT example's training loop and flags: the tiny model learns the default
// corpus below its unigram entropy, gradient accumulation equals one larger
// batch, and the command line fills the config or fails with a clear message.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <vector>

#include "examples/gpt/train_config.h"
#include "examples/gpt/trainer.h"
#include "tensor/error.h"

namespace fs = std::filesystem;
using gpt::TrainConfig;

namespace {

TrainConfig tiny_config() {
  TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("tiny");
  config.seq_len = 64;
  config.batch = 16;
  config.steps = 200;
  config.warmup = 40;
  config.lr = 3e-3;
  config.eval_every = 0;
  return config;
}

double mean(const std::vector<double>& values, size_t first, size_t last) {
  return std::accumulate(values.begin() + static_cast<std::ptrdiff_t>(first),
                         values.begin() + static_cast<std::ptrdiff_t>(last), 0.0) /
         static_cast<double>(last - first);
}

struct Parsed {
  std::optional<int> exit_code;
  TrainConfig config;
  std::string out, err;
};

Parsed parse(std::vector<const char*> args) {
  args.insert(args.begin(), "train");
  Parsed parsed;
  std::ostringstream out, err;
  parsed.exit_code = gpt::parse_command_line(static_cast<int>(args.size()), args.data(), parsed.config, out, err);
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}

}  // namespace

TEST_CASE("the tiny model learns the default corpus: loss falls below the unigram entropy") {
  TrainConfig config = tiny_config();
  config.eval_every = config.steps;
  std::ostringstream log;
  gpt::TrainSummary summary = gpt::train(config, log);
  REQUIRE(summary.losses.size() == 200);
  const double first = summary.losses.front();
  const double last = mean(summary.losses, 190, 200);
  INFO("log:\n" << log.str());
  // Untrained, the model guesses about uniformly over 256 bytes: ln 256 = 5.55.
  CHECK(first == doctest::Approx(std::log(256.0)).epsilon(0.05));
  // The default corpus has a unigram entropy of 3.31 nats (fortunes) or 3.21
  // (licence texts); beating it means the model uses context.
  CHECK(summary.unigram_entropy > 2.5);
  CHECK(summary.unigram_entropy < 3.6);
  CHECK(last < summary.unigram_entropy - 0.3);
  REQUIRE(summary.val_loss.has_value());
  CHECK(*summary.val_loss < summary.unigram_entropy);
  CHECK(log.str().find("unigram entropy") != std::string::npos);
}

TEST_CASE("gradient accumulation: 2 micro-batches of 4 make the same step as one batch of 8") {
  // Row b of micro-batch m starts at draw m * batch + b, so both see rows 0..7.
  TrainConfig whole = tiny_config();
  whole.data = gpt::kSyntheticData;
  whole.steps = 3;
  whole.warmup = 0;
  whole.batch = 8;
  TrainConfig split = whole;
  split.batch = 4;
  split.grad_accum = 2;

  gpt::Trainer a(whole, gpt::build_data(whole));
  gpt::Trainer b(split, gpt::build_data(split));
  for (int step = 0; step < 3; ++step) {
    gpt::StepMetrics ma = a.train_step(), mb = b.train_step();
    CHECK(ma.loss == doctest::Approx(mb.loss).epsilon(1e-5));
    CHECK(ma.grad_norm == doctest::Approx(mb.grad_norm).epsilon(1e-4));
  }
  auto pa = a.model().named_parameters(), pb = b.model().named_parameters();
  REQUIRE(pa.size() == pb.size());
  double max_diff = 0.0;
  for (size_t i = 0; i < pa.size(); ++i) {
    auto va = pa[i].second->tensor().to_vector<float>(), vb = pb[i].second->tensor().to_vector<float>();
    for (size_t j = 0; j < va.size(); ++j) max_diff = std::max(max_diff, std::abs(double(va[j]) - double(vb[j])));
  }
  CHECK(max_diff < 1e-5);
}

TEST_CASE("one step: its metrics and warmup lr; evaluation is repeatable and keeps training mode") {
  TrainConfig config = tiny_config();
  config.data = gpt::kSyntheticData;
  config.model.vocab_size = 16;
  config.eval_batches = 2;
  gpt::Trainer trainer(config, gpt::build_data(config));
  const double before = trainer.evaluate();
  CHECK(before == doctest::Approx(trainer.evaluate()));
  CHECK(before == doctest::Approx(std::log(16.0)).epsilon(0.05));
  auto metrics = trainer.train_step();
  CHECK(metrics.step == 1);
  CHECK(trainer.steps_done() == 1);
  CHECK(metrics.lr == doctest::Approx(3e-3 / 40));  // first of 40 warmup steps
  CHECK(metrics.grad_norm > 0.0);
  CHECK(metrics.tokens_per_s > 0.0);
  CHECK(metrics.peak_mem_bytes > 0);
  CHECK(metrics.peak_rss_bytes > 0);
  CHECK(trainer.model().is_training());
}

TEST_CASE("the data's tokens must fit the model's vocab") {
  char path[] = "/tmp/tessera-vocab-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << std::string(400, 'o');  // byte 111
  TrainConfig config = tiny_config();
  config.data = path;
  config.seq_len = 8;
  config.model.vocab_size = 100;
  CHECK_THROWS_WITH_AS(gpt::build_data(config),
                       doctest::Contains("holds tokens up to 111, but the model's vocab is 100; pass --vocab 112"),
                       tessera::Error);
  config.model.vocab_size = 112;
  CHECK(gpt::build_data(config).token_range() == 112);
  fs::remove(path);
}

TEST_CASE("command line: the preset first, then explicit flags") {
  Parsed defaults = parse({});
  CHECK_FALSE(defaults.exit_code.has_value());
  CHECK(defaults.config.preset == "tiny");
  CHECK(defaults.config.model.n_layer == tessera::nn::GPTConfig::preset("tiny").n_layer);
  CHECK(defaults.config.seq_len == defaults.config.model.block_size);

  Parsed big = parse({"--preset", "gpt2-124m", "--n-layer", "2", "--seq-len", "128", "--batch", "3", "--grad-accum",
                      "5", "--clip", "0", "--data", "synthetic", "--threads", "1", "--seed", "9", "--lr", "1e-4"});
  REQUIRE_FALSE(big.exit_code.has_value());
  CHECK(big.config.model.n_layer == 2);     // overridden
  CHECK(big.config.model.n_embd == 768);    // from the preset
  CHECK(big.config.model.vocab_size == 50257);
  CHECK(big.config.model.block_size == 1024);  // the context stays; T is 128
  CHECK(big.config.seq_len == 128);
  CHECK(big.config.tokens_per_step() == 3 * 128 * 5);
  CHECK(big.config.clip == 0.0);
  CHECK(big.config.seed == 9);
  CHECK(big.config.lr == doctest::Approx(1e-4));

  Parsed longer = parse({"--seq-len", "256"});
  REQUIRE_FALSE(longer.exit_code.has_value());
  CHECK(longer.config.model.block_size == 256);  // the tiny context grows to fit

  Parsed short_run = parse({"--steps", "5"});
  REQUIRE_FALSE(short_run.exit_code.has_value());
  CHECK(short_run.config.warmup == 5);  // the default warmup shrinks to the run
}

TEST_CASE("command line: bad values exit non-zero with a message naming the flag") {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--batch", "0"}, "--batch: must be > 0, got 0"},
      {{"--steps", "many"}, "--steps: 'many' is not a number"},
      {{"--lr", "-1"}, "--lr: must be > 0, got -1"},
      {{"--preset", "gpt5"}, "--preset: gpt5 not in"},
      {{"--n-head", "3"}, "n_embd (64) must be a positive multiple of n_head (3)"},
      {{"--steps", "10", "--warmup", "11"}, "--warmup must be in [0, --steps = 10], got 11"},
      {{"--no-such-flag"}, "--no-such-flag"},
  };
  for (const auto& [args, message] : cases) {
    CAPTURE(message);
    Parsed parsed = parse(args);
    REQUIRE(parsed.exit_code.has_value());
    CHECK(*parsed.exit_code != 0);
    CHECK(parsed.err.find(message) != std::string::npos);
  }
  Parsed help = parse({"--help"});
  REQUIRE(help.exit_code.has_value());
  CHECK(*help.exit_code == 0);
  CHECK(help.out.find("--grad-accum") != std::string::npos);
}

TEST_CASE("an unwritable --log-json path is an error before training starts") {
  TrainConfig config = tiny_config();
  config.log_json = "/nonexistent-dir/log.jsonl";
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(gpt::train(config, log), doctest::Contains("cannot open '/nonexistent-dir/log.jsonl'"),
                       tessera::Error);
  CHECK(log.str().empty());
}
