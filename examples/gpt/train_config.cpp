// train's flags (CLI11): the preset fills the model shape first, then every
// shape flag given explicitly overrides its field.
#include "examples/gpt/train_config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "tensor/error.h"

namespace gpt {

namespace {

// A flag's value must be a number above (or at least) `bound`: CLI11's own
// range checks print the whole double range in their message.
CLI::Validator bounded_below(double bound, bool inclusive) {
  const std::string relation = inclusive ? ">=" : ">";
  return CLI::Validator(
      [bound, inclusive, relation](std::string& input) -> std::string {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(input, value)) return fmt::format("'{}' is not a number", input);
        if (inclusive ? value >= bound : value > bound) return {};
        return fmt::format("must be {} {:g}, got {}", relation, bound, input);
      },
      fmt::format("{} {:g}", relation, bound));
}

const CLI::Validator kPositive = bounded_below(0.0, false);
const CLI::Validator kNonNegative = bounded_below(0.0, true);

}  // namespace

void TrainConfig::validate() const {
  model.validate();
  TESSERA_CHECK(seq_len >= 1 && seq_len <= model.block_size, "--seq-len must be in [1, block_size = {}], got {}",
                model.block_size, seq_len);
  TESSERA_CHECK(batch >= 1, "--batch must be >= 1, got {}", batch);
  TESSERA_CHECK(grad_accum >= 1, "--grad-accum must be >= 1, got {}", grad_accum);
  TESSERA_CHECK(steps >= 1, "--steps must be >= 1, got {}", steps);
  TESSERA_CHECK(lr > 0.0, "--lr must be > 0, got {}", lr);
  TESSERA_CHECK(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio must be in [0, 1], got {}", min_lr_ratio);
  TESSERA_CHECK(warmup >= 0 && warmup <= steps, "--warmup must be in [0, --steps = {}], got {}", steps, warmup);
  TESSERA_CHECK(weight_decay >= 0.0, "--weight-decay must be >= 0, got {}", weight_decay);
  TESSERA_CHECK(clip >= 0.0, "--clip must be >= 0 (0 = off), got {}", clip);
  TESSERA_CHECK(threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", threads);
  TESSERA_CHECK(eval_every >= 0, "--eval-every must be >= 0 (0 = never), got {}", eval_every);
  TESSERA_CHECK(eval_batches >= 1, "--eval-batches must be >= 1, got {}", eval_batches);
}

std::optional<int> parse_command_line(int argc, const char* const* argv, TrainConfig& config, std::ostream& out,
                                      std::ostream& err) {
  CLI::App app{"Trains a GPT-2 style model with tessera on one machine (byte-level text by default)", "train"};
  app.option_defaults()->always_capture_default();

  const std::vector<std::string> presets = tessera::nn::GPTConfig::preset_names();
  app.add_option("--preset", config.preset, "Model shape preset")->check(CLI::IsMember(presets));
  // Shape overrides: applied on top of the preset only when given.
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab = 0, seq_len = 0;
  auto* n_layer_flag = app.add_option("--n-layer", n_layer, "Transformer blocks")->check(kPositive);
  auto* n_head_flag = app.add_option("--n-head", n_head, "Attention heads")->check(kPositive);
  auto* n_embd_flag = app.add_option("--n-embd", n_embd, "Embedding width (a multiple of --n-head)")
                          ->check(kPositive);
  auto* vocab_flag = app.add_option("--vocab", vocab, "Vocabulary size (>= the data's largest token + 1)")
                         ->check(kPositive);
  auto* seq_len_flag = app.add_option("--seq-len", seq_len,
                                      "Tokens per sequence (default: the preset's context; the context grows to fit)")
                           ->check(kPositive);
  for (auto* flag : {n_layer_flag, n_head_flag, n_embd_flag, vocab_flag, seq_len_flag}) flag->default_str("preset");

  app.add_option("--batch", config.batch, "Sequences per micro-batch")->check(kPositive);
  app.add_option("--grad-accum", config.grad_accum, "Micro-batches per optimizer step")->check(kPositive);
  app.add_option("--steps", config.steps, "Optimizer steps")->check(kPositive);
  app.add_option("--lr", config.lr, "Peak learning rate (cosine decay to lr/10)")->check(kPositive);
  auto* warmup_flag = app.add_option("--warmup", config.warmup, "Linear warmup steps (at most --steps)")
                          ->check(kNonNegative);
  app.add_option("--weight-decay", config.weight_decay, "AdamW weight decay on matmul and embedding weights")
      ->check(kNonNegative);
  app.add_option("--clip", config.clip, "Max global gradient norm (0 = off)")->check(kNonNegative);
  app.add_option("--seed", config.seed, "Seed of model init and data order");
  app.add_option("--threads", config.threads, "CPU threads (0 = all cores)")->check(kNonNegative);
  app.add_option("--data", config.data, "Token file (text, or llm.c .bin), or 'synthetic'")
      ->default_str("the Debian corpus");
  app.add_option("--log-json", config.log_json, "Write one JSON object per step to this file");
  app.add_option("--eval-every", config.eval_every, "Validation loss every N steps (0 = never)")
      ->check(kNonNegative);
  app.add_option("--eval-batches", config.eval_batches, "Micro-batches per validation")->check(kPositive);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error, out, err);
  }

  try {
    config.model = tessera::nn::GPTConfig::preset(config.preset);
    if (n_layer_flag->count() > 0) config.model.n_layer = n_layer;
    if (n_head_flag->count() > 0) config.model.n_head = n_head;
    if (n_embd_flag->count() > 0) config.model.n_embd = n_embd;
    if (vocab_flag->count() > 0) config.model.vocab_size = vocab;
    config.seq_len = seq_len_flag->count() > 0 ? seq_len : config.model.block_size;
    if (config.seq_len > config.model.block_size) config.model.block_size = config.seq_len;
    // The default warmup shrinks for short runs; an explicit one must fit.
    if (warmup_flag->count() == 0) config.warmup = std::min(config.warmup, config.steps);
    config.validate();
  } catch (const tessera::Error& error) {
    err << "train: error: " << error.what() << "\nRun with --help for more information.\n";
    return 2;
  }
  return std::nullopt;
}

std::string describe(const TrainConfig& c) {
  const auto& m = c.model;
  return fmt::format(
      "model    {}: n_layer {}, n_head {}, n_embd {}, vocab {}, context {} ({:.3f} M parameters)\n"
      "batch    {} x {} tokens x {} micro-batches = {} tokens per step, {} steps\n"
      "optim    AdamW lr {:g} (warmup {}, cosine to {:g}), weight decay {:g}, clip {}\n"
      "seed     {}",
      c.preset, m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.block_size,
      static_cast<double>(m.num_parameters()) / 1e6, c.batch, c.seq_len, c.grad_accum, c.tokens_per_step(), c.steps,
      c.lr, c.warmup, c.lr * c.min_lr_ratio, c.weight_decay, c.clip > 0.0 ? fmt::format("{:g}", c.clip) : "off",
      c.seed);
}

}  // namespace gpt
