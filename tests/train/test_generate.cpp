// The GPT example's `generate` side: the model config's JSON form round-trips
// and rejects every malformed field with the source and field named; sampling
// is greedy at temperature 0, never leaves the top k, matches the softmax
// frequencies at any temperature, cuts to the top-p nucleus and depends only
// on (key, draw); generation crops its context to block_size, takes uint32
// tokens and refuses bad inputs; byte tokens print safely; and a model
// comes back bit for bit from a checkpoint saved on 3 FSDP ranks or from a
// .safetensors file. A Llama's config JSON names its family, and a Llama
// trained on 2 FSDP ranks comes back from its checkpoint and its export as a
// Llama whose logits are the trained model's.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "autograd/grad_mode.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/state_dict.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/fsdp/equivalence.h"
#include "train/byte_text.h"
#include "train/checkpoint_manager.h"
#include "train/config_json.h"
#include "train/generation.h"
#include "train/model_loader.h"
#include "train/sampling.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using tessera::PhiloxKey;
using tessera::Tensor;
using tessera::nn::GPTConfig;

using tessera::checkpoint::testing::TempDir;

namespace {

GPTConfig unusual_config() {
  GPTConfig config;
  config.vocab_size = 97;
  config.block_size = 48;
  config.n_layer = 3;
  config.n_head = 4;
  config.n_embd = 32;
  config.dropout = 0.125;
  config.bias = false;
  config.norm_eps = 1e-6;
  return config;
}

// model_config_from_json of a GPT's JSON: a GPTConfig (std::get throws for another family).
GPTConfig gpt_config_from_json(const json& value, const std::string& source) {
  return std::get<GPTConfig>(tessera::train::model_config_from_json(value, source));
}

void check_same_config(const GPTConfig& a, const GPTConfig& b) {
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.block_size == b.block_size);
  CHECK(a.n_layer == b.n_layer);
  CHECK(a.n_head == b.n_head);
  CHECK(a.n_embd == b.n_embd);
  CHECK(a.dropout == b.dropout);
  CHECK(a.bias == b.bias);
  CHECK(a.norm_eps == b.norm_eps);
  CHECK(a.vocab_padding_multiple == b.vocab_padding_multiple);
}

Tensor logits_of(const std::vector<float>& values) {
  return tessera::ops::from_vector(values, {static_cast<int64_t>(values.size())});
}

// sample_token with no top-p cut.
int64_t sample(const Tensor& row, double temperature, int64_t top_k, PhiloxKey key, uint64_t draw) {
  return tessera::train::sample_token(row, {.temperature = temperature, .top_k = top_k, .key = key}, draw);
}

// softmax(logits / temperature) over the k largest logits (no ties in the tests).
std::vector<double> expected_probabilities(const std::vector<float>& logits, double temperature, int64_t k) {
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const float threshold = sorted[static_cast<size_t>(k - 1)];
  std::vector<double> probabilities(logits.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= threshold) probabilities[i] = std::exp((logits[i] - sorted[0]) / temperature);
    total += probabilities[i];
  }
  for (double& p : probabilities) p /= total;
  return probabilities;
}

// Frequencies of `draws` samples.
std::vector<double> sampled_frequencies(const std::vector<float>& logits, double temperature, int64_t top_k,
                                        PhiloxKey key, int draws) {
  const Tensor row = logits_of(logits);
  std::vector<double> frequencies(logits.size(), 0.0);
  int out_of_range = 0;
  for (int draw = 0; draw < draws; ++draw) {
    const int64_t token = sample(row, temperature, top_k, key, static_cast<uint64_t>(draw));
    if (token < 0 || token >= static_cast<int64_t>(logits.size())) {
      ++out_of_range;
      continue;
    }
    frequencies[static_cast<size_t>(token)] += 1.0 / draws;
  }
  CHECK(out_of_range == 0);
  return frequencies;
}

// One prompt's tokens and continuation (generation.h).
std::vector<uint32_t> continue_prompt(tessera::nn::CausalLM& model, const std::vector<uint32_t>& prompt,
                                      int64_t max_new_tokens, const tessera::train::SamplingOptions& sampling) {
  return tessera::train::generate(model, {prompt}, {.max_new_tokens = max_new_tokens, .sampling = sampling}).front().tokens;
}

// 10 logits, all distinct, largest at index 6.
const std::vector<float> kLogits = {0.3f, -1.2f, 1.1f, 0.0f, 2.0f, -0.4f, 2.6f, 0.9f, 1.7f, -2.5f};

// A GPT with bits that depend only on `seed` (meta, to_empty, reset_parameters).
std::unique_ptr<tessera::nn::GPT> seeded_model(const GPTConfig& config, uint64_t seed) {
  auto model = std::make_unique<tessera::nn::GPT>(config, tessera::kMeta);
  model->to_empty(tessera::kCPU);
  model->reset_parameters(seed);
  return model;
}

// The greedy next token of `model` after `context`, computed directly.
uint32_t greedy_next(tessera::nn::CausalLM& model, const std::vector<uint32_t>& context) {
  tessera::autograd::NoGradGuard no_grad;
  const std::vector<int64_t> idx(context.begin(), context.end());
  const Tensor logits = model(tessera::ops::from_vector(idx, {1, static_cast<int64_t>(idx.size())}));
  const Tensor last = tessera::ops::select(tessera::ops::select(logits, 0, 0), 0, static_cast<int64_t>(idx.size()) - 1);
  return static_cast<uint32_t>(tessera::ops::argmax(last, 0).item<int64_t>());
}

// Every parameter of `a` equals `b`'s bit for bit; returns how many were compared.
size_t check_same_parameters(const tessera::nn::Module& a, const tessera::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pa[i].first == pb[i].first);
    CHECK(pa[i].second->tensor().to_vector<float>() == pb[i].second->tensor().to_vector<float>());
  }
  return pa.size();
}

}  // namespace

// ---- config JSON ------------------------------------------------------------------------------

TEST_CASE("model config JSON: every field round-trips, through text too") {
  const GPTConfig config = unusual_config();
  const json encoded = tessera::train::model_config_to_json(config);
  std::set<std::string> keys;
  for (const auto& [key, value] : encoded.items()) keys.insert(key);
  CHECK(keys == std::set<std::string>{"vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias",
                                      "norm_eps"});
  check_same_config(gpt_config_from_json(encoded, "test"), config);
  check_same_config(gpt_config_from_json(json::parse(encoded.dump()), "test"), config);
  for (const std::string& preset : GPTConfig::preset_names()) {
    check_same_config(
        gpt_config_from_json(json::parse(tessera::train::model_config_to_json(GPTConfig::preset(preset)).dump()), preset),
        GPTConfig::preset(preset));
  }
}

// Written only when it pads, so configs from before the padding (no field)
// read back unpadded, and an unpadded model's JSON is unchanged.
TEST_CASE("model config JSON: vocab_padding_multiple is optional, checked, and round-trips") {
  GPTConfig padded = unusual_config();
  padded.vocab_padding_multiple = 64;
  const json encoded = tessera::train::model_config_to_json(padded);
  CHECK(encoded.at("vocab_padding_multiple") == 64);
  check_same_config(gpt_config_from_json(json::parse(encoded.dump()), "test"), padded);
  CHECK_FALSE(tessera::train::model_config_to_json(unusual_config()).contains("vocab_padding_multiple"));
  CHECK(gpt_config_from_json(tessera::train::model_config_to_json(GPTConfig::preset("gpt2-124m")), "t").padded_vocab_size() ==
        50304);
  json wrong = encoded;
  wrong["vocab_padding_multiple"] = 1.5;
  CHECK_THROWS_WITH_AS(gpt_config_from_json(wrong, "run/config.json"),
                       doctest::Contains("run/config.json: model config: field 'vocab_padding_multiple' must be an "
                                         "integer, got number 1.5"),
                       tessera::Error);
  wrong["vocab_padding_multiple"] = 0;
  CHECK_THROWS_WITH_AS(gpt_config_from_json(wrong, "run/config.json"),
                       doctest::Contains("vocab_padding_multiple must be in [1, 1024], got 0"), tessera::Error);
}

TEST_CASE("model config JSON: every malformed field is an error naming the source and the field") {
  const json good = tessera::train::model_config_to_json(unusual_config());
  const std::string source = "ckpt/metadata.json";
  auto error_of = [&source](const json& value) -> std::string {
    try {
      tessera::train::model_config_from_json(value, source);
    } catch (const tessera::Error& error) {
      return error.what();
    }
    return "no error";
  };

  CHECK(error_of(json::array({1, 2})).find("must be a JSON object, got array") != std::string::npos);
  CHECK(error_of(json(3)).find(source) != std::string::npos);
  for (const auto& [field, value] : good.items()) {
    INFO(field);
    json missing = good;
    missing.erase(field);
    const std::string message = error_of(missing);
    CHECK(message.find(source) != std::string::npos);
    CHECK(message.find("field '" + field + "' is missing") != std::string::npos);

    json wrong = good;
    wrong[field] = "12";
    CHECK(error_of(wrong).find("field '" + field + "' must be") != std::string::npos);
    wrong[field] = nullptr;
    CHECK(error_of(wrong).find("field '" + field + "' must be") != std::string::npos);
  }
  const std::vector<std::string> integer_fields = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"};
  for (const std::string& field : integer_fields) {
    INFO(field);
    json fractional = good;
    fractional[field] = 4.0;  // a float, even a whole one, is not a size
    CHECK(error_of(fractional).find("field '" + field + "' must be an integer, got number 4.0") != std::string::npos);
    json flag = good;
    flag[field] = true;
    CHECK(error_of(flag).find("field '" + field + "' must be an integer, got boolean true") != std::string::npos);
    json huge = good;
    huge[field] = std::numeric_limits<uint64_t>::max();
    CHECK(error_of(huge).find("field '" + field + "' is out of range") != std::string::npos);
  }
  json bias = good;
  bias["bias"] = 1;
  CHECK(error_of(bias).find("field 'bias' must be true or false, got integer 1") != std::string::npos);
  json dropout = good;
  dropout["dropout"] = json::array({0.1});
  CHECK(error_of(dropout).find("field 'dropout' must be a number, got array") != std::string::npos);
  json extra = good;
  extra["rope"] = true;
  CHECK(error_of(extra).find("unknown field 'rope'") != std::string::npos);

  // Well-typed but inconsistent: GPTConfig::validate's message, with the source.
  auto invalid = [&](const std::string& field, const json& value, const std::string& expected) {
    json config = good;
    config[field] = value;
    const std::string message = error_of(config);
    INFO(message);
    CHECK(message.find(source) != std::string::npos);
    CHECK(message.find(expected) != std::string::npos);
  };
  invalid("vocab_size", 0, "vocab_size must be positive");
  invalid("block_size", -4, "block_size must be positive");
  invalid("n_layer", 0, "n_layer must be positive");
  invalid("n_head", 0, "n_head must be positive");
  invalid("n_embd", 30, "n_embd (30) must be a positive multiple of n_head (4)");
  invalid("dropout", 1.0, "dropout must be in [0, 1)");
  invalid("norm_eps", 0, "norm_eps must be positive");
  // Integers are numbers: dropout 0 and norm_eps 1 are fine.
  json whole_numbers = good;
  whole_numbers["dropout"] = 0;
  whole_numbers["norm_eps"] = 1;
  CHECK(gpt_config_from_json(whole_numbers, source).norm_eps == 1.0);
}

TEST_CASE("train config JSON records the run's settings") {
  tessera::train::TrainConfig config;
  config.preset = "nano";
  config.seq_len = 24;
  config.batch = 3;
  config.grad_accum = 2;
  config.grad_sync = tessera::fsdp::GradientSync::every_micro_batch;
  config.steps = 11;
  config.lr = 2e-3;
  config.min_lr_ratio = 0.05;
  config.warmup = 4;
  config.weight_decay = 0.02;
  config.clip = 0.5;
  config.seed = std::numeric_limits<uint64_t>::max();
  config.data = "/tmp/tokens.bin";
  config.tokenizer = "/tmp/tokenizer.json";
  config.nproc = 4;
  config.hsdp = 2;
  config.reshard_after_forward = tessera::fsdp::ReshardAfterForward::to_group_of(2);
  config.param_dtype = tessera::DType::bf16;
  config.deterministic = true;
  config.ac = tessera::nn::ActivationCheckpointPolicy::parse("every:3");
  config.lora_rank = 4;
  config.nf4 = true;
  const json recorded = tessera::train::train_config_to_json(config);
  const json expected = {{"preset", "nano"},
                         {"seq_len", 24},
                         {"batch", 3},
                         {"grad_accum", 2},
                         {"grad_sync", "every"},
                         {"steps", 11},
                         {"lr", 2e-3},
                         {"min_lr_ratio", 0.05},
                         {"warmup", 4},
                         {"weight_decay", 0.02},
                         {"clip", 0.5},
                         {"seed", std::numeric_limits<uint64_t>::max()},
                         {"data", "/tmp/tokens.bin"},
                         {"tokenizer", "/tmp/tokenizer.json"},
                         {"init_from", ""},
                         {"nproc", 4},
                         {"hsdp", 2},
                         {"tp", 1},
                         {"async_tp", 0},
                         {"ac", "every:3"},
                         {"float8", false},
                         {"lora_rank", 4},
                         {"lora_alpha", 8.0},
                         {"nf4", true},
                         {"reshard_after_forward", 2},
                         {"param_dtype", "bf16"},
                         {"reduce_dtype", nullptr},
                         {"deterministic", true}};
  CHECK(recorded == expected);
  CHECK(json::parse(recorded.dump()) == expected);

  config.reshard_after_forward = false;
  config.reduce_dtype = tessera::DType::f32;
  const json other = tessera::train::train_config_to_json(config);
  CHECK(other["reshard_after_forward"] == json(false));
  CHECK(other["reshard_after_forward"].is_boolean());
  CHECK(other["reduce_dtype"] == json("f32"));
}

// ---- sampling ---------------------------------------------------------------------------------

TEST_CASE("sample_token: temperature 0 is the argmax, and top_k = 1 is too") {
  const Tensor row = logits_of(kLogits);
  for (uint64_t draw = 0; draw < 50; ++draw) {
    CHECK(sample(row, 0.0, 0, PhiloxKey{draw, 1}, draw) == 6);
    CHECK(sample(row, 0.0, 3, PhiloxKey{draw, 1}, draw) == 6);
    CHECK(sample(row, 1.0, 1, PhiloxKey{draw, 1}, draw) == 6);
    CHECK(sample(row, 50.0, 1, PhiloxKey{draw, 1}, draw) == 6);
  }
  // Equal maxima: the lowest index, both ways.
  const Tensor tied = logits_of({1.0f, 3.0f, -2.0f, 3.0f});
  CHECK(sample(tied, 0.0, 0, PhiloxKey{}, 0) == 1);
  for (uint64_t draw = 0; draw < 20; ++draw) CHECK(sample(tied, 1.0, 1, PhiloxKey{}, draw) == 1);
  // Random rows: top_k = 1 at any temperature is the argmax.
  for (uint64_t trial = 0; trial < 20; ++trial) {
    const Tensor random_row = tessera::ops::randn({37}, PhiloxKey{trial, 9});
    const int64_t argmax = tessera::ops::argmax(random_row, 0).item<int64_t>();
    CHECK(sample(random_row, 0.0, 0, PhiloxKey{trial, 2}, trial) == argmax);
    CHECK(sample(random_row, 0.7, 1, PhiloxKey{trial, 2}, trial) == argmax);
  }
  // Other floating dtypes are read as they are.
  CHECK(sample(tessera::ops::to(row, tessera::DType::bf16), 0.0, 0, PhiloxKey{}, 0) == 6);
}

TEST_CASE("sample_token: top-k sampling never leaves the top k and matches softmax frequencies") {
  constexpr int kDraws = 200000;
  // A frequency over 200k draws has a binomial standard deviation of at most
  // 0.0011 (p = 0.5): 0.006 is at least 5.4 of them, so a correct sampler
  // fails one of this test's and the next one's 70 comparisons with
  // probability 2e-7. The keys are fixed, so a pass holds for good.
  constexpr double kTolerance = 0.006;
  for (const int64_t k : {int64_t{2}, int64_t{4}, int64_t{10}, int64_t{0}}) {
    INFO("top_k " << k);
    const std::vector<double> frequencies = sampled_frequencies(kLogits, 1.0, k, PhiloxKey{42, 7}, kDraws);
    const std::vector<double> expected = expected_probabilities(kLogits, 1.0, k == 0 ? 10 : k);
    for (size_t i = 0; i < kLogits.size(); ++i) {
      INFO("token " << i << ": sampled " << frequencies[i] << ", softmax " << expected[i]);
      if (expected[i] == 0.0) {
        CHECK(frequencies[i] == 0.0);  // outside the top k: never
      } else {
        CHECK(std::abs(frequencies[i] - expected[i]) < kTolerance);
      }
    }
  }
}

TEST_CASE("sample_token: the temperature scales the logits before the softmax") {
  constexpr int kDraws = 200000;
  constexpr double kTolerance = 0.006;  // as above
  for (const double temperature : {0.5, 2.0, 8.0}) {
    INFO("temperature " << temperature);
    const std::vector<double> frequencies = sampled_frequencies(kLogits, temperature, 5, PhiloxKey{3, 1}, kDraws);
    const std::vector<double> expected = expected_probabilities(kLogits, temperature, 5);
    for (size_t i = 0; i < kLogits.size(); ++i) {
      INFO("token " << i << ": sampled " << frequencies[i] << ", softmax " << expected[i]);
      CHECK(std::abs(frequencies[i] - expected[i]) < kTolerance);
    }
  }
  // Colder is sharper: the argmax's share grows as the temperature falls
  // (softmax: 0.891, 0.383, 0.161; over 20k draws their standard deviations
  // are at most 0.0034, so each bound below is 19 or more of them away).
  const double cold = sampled_frequencies(kLogits, 0.25, 0, PhiloxKey{5, 5}, 20000)[6];
  const double warm = sampled_frequencies(kLogits, 1.0, 0, PhiloxKey{5, 5}, 20000)[6];
  const double hot = sampled_frequencies(kLogits, 4.0, 0, PhiloxKey{5, 5}, 20000)[6];
  CHECK(cold > 0.85);
  CHECK(cold > warm);
  CHECK(warm > hot);
  CHECK(hot < 0.25);
}

// softmax(logits / temperature) over the top-p nucleus of the k largest
// logits: the fewest most likely whose probabilities reach top_p.
std::vector<double> nucleus_probabilities(const std::vector<float>& logits, double temperature, int64_t k,
                                          double top_p) {
  std::vector<double> probabilities = expected_probabilities(logits, temperature, k);
  std::vector<size_t> order(logits.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probabilities[a] > probabilities[b]; });
  double kept = 0.0;  // the probability of the tokens before the next one
  for (const size_t i : order) {
    if (kept >= top_p) {
      probabilities[i] = 0.0;
    } else {
      kept += probabilities[i];
    }
  }
  for (double& p : probabilities) p /= kept;
  return probabilities;
}

TEST_CASE("sample_token: top-p keeps the fewest most likely tokens whose probability reaches p") {
  // softmax(kLogits) sorted: 0.383 (6), 0.210 (4), 0.156 (8), 0.085 (2), 0.070 (7), ...
  const Tensor row = logits_of(kLogits);
  auto sample_top_p = [&](double temperature, int64_t top_k, double top_p, uint64_t draw) {
    return tessera::train::sample_token(row, {.temperature = temperature, .top_k = top_k, .top_p = top_p, .key = {8, 2}}, draw);
  };
  // p at most the largest probability: only the argmax, at any temperature.
  for (uint64_t draw = 0; draw < 200; ++draw) {
    CHECK(sample_top_p(1.0, 0, 0.3, draw) == 6);
    CHECK(sample_top_p(1.0, 0, 1e-9, draw) == 6);
  }
  // Just past the first: the top two, nothing else.
  std::set<int64_t> chosen;
  for (uint64_t draw = 0; draw < 500; ++draw) chosen.insert(sample_top_p(1.0, 0, 0.4, draw));
  CHECK(chosen == std::set<int64_t>{4, 6});
  // The frequencies are the renormalised nucleus, with top_k and temperature applied first.
  constexpr int kDraws = 200000;
  constexpr double kTolerance = 0.006;  // as in the top-k test
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  const std::vector<Case> cases = {{1.0, 0, 0.6}, {1.0, 0, 0.8}, {2.0, 0, 0.5}, {1.0, 3, 0.9}, {0.5, 0, 0.95}};
  for (const Case c : cases) {
    INFO("temperature " << c.temperature << ", top_k " << c.top_k << ", top_p " << c.top_p);
    const std::vector<double> expected = nucleus_probabilities(kLogits, c.temperature, c.top_k == 0 ? 10 : c.top_k,
                                                               c.top_p);
    std::vector<double> frequencies(kLogits.size(), 0.0);
    for (int draw = 0; draw < kDraws; ++draw) {
      frequencies[static_cast<size_t>(sample_top_p(c.temperature, c.top_k, c.top_p, static_cast<uint64_t>(draw)))] +=
          1.0 / kDraws;
    }
    for (size_t i = 0; i < kLogits.size(); ++i) {
      INFO("token " << i << ": sampled " << frequencies[i] << ", nucleus " << expected[i]);
      if (expected[i] == 0.0) {
        CHECK(frequencies[i] == 0.0);
      } else {
        CHECK(std::abs(frequencies[i] - expected[i]) < kTolerance);
      }
    }
  }
  // top_p = 1 is no cut: the same tokens as without it.
  for (uint64_t draw = 0; draw < 100; ++draw) {
    CHECK(sample_top_p(1.0, 0, 1.0, draw) == sample(row, 1.0, 0, {8, 2}, draw));
  }
  for (const double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    CHECK_THROWS_WITH_AS(sample_top_p(1.0, 0, bad, 0), doctest::Contains("top_p must be in (0, 1]"), tessera::Error);
  }
}

TEST_CASE("sample_token: a draw depends only on (key, draw); -inf logits are never chosen") {
  const Tensor row = logits_of(kLogits);
  std::vector<int64_t> first, again, other_seed, other_stream;
  for (uint64_t draw = 0; draw < 300; ++draw) {
    first.push_back(sample(row, 1.5, 0, PhiloxKey{11, 3}, draw));
    other_seed.push_back(sample(row, 1.5, 0, PhiloxKey{12, 3}, draw));
    other_stream.push_back(sample(row, 1.5, 0, PhiloxKey{11, 4}, draw));
  }
  for (uint64_t draw = 300; draw-- > 0;)
    again.insert(again.begin(), sample(row, 1.5, 0, PhiloxKey{11, 3}, draw));
  CHECK(first == again);  // any order of calls, the same tokens
  CHECK(first != other_seed);
  CHECK(first != other_stream);
  CHECK(std::set<int64_t>(first.begin(), first.end()).size() > 5);  // it does sample

  const float minus_infinity = -std::numeric_limits<float>::infinity();
  const Tensor masked = logits_of({minus_infinity, 0.0f, minus_infinity, 0.0f, minus_infinity});
  std::set<int64_t> chosen;
  for (uint64_t draw = 0; draw < 200; ++draw) chosen.insert(sample(masked, 3.0, 0, PhiloxKey{1, 1}, draw));
  CHECK(chosen == std::set<int64_t>{1, 3});
  // top_k reaching into the -inf logits changes nothing.
  for (uint64_t draw = 0; draw < 50; ++draw) {
    const int64_t token = sample(masked, 1.0, 4, PhiloxKey{1, 1}, draw);
    CHECK((token == 1 || token == 3));
  }
}

TEST_CASE("sample_token: bad inputs are errors that say what was wrong") {
  const Tensor row = logits_of(kLogits);
  CHECK_THROWS_WITH_AS(sample(row, -0.1, 0, PhiloxKey{}, 0), doctest::Contains("temperature must be"),
                       tessera::Error);
  CHECK_THROWS_WITH_AS(sample(row, std::nan(""), 0, PhiloxKey{}, 0), doctest::Contains("temperature"),
                       tessera::Error);
  CHECK_THROWS_WITH_AS(sample(row, std::numeric_limits<double>::infinity(), 0, PhiloxKey{}, 0),
                       doctest::Contains("temperature"), tessera::Error);
  CHECK_THROWS_WITH_AS(sample(row, 1.0, -1, PhiloxKey{}, 0),
                       doctest::Contains("top_k must be in [0, vocab size 10]"), tessera::Error);
  CHECK_THROWS_WITH_AS(sample(row, 1.0, 11, PhiloxKey{}, 0), doctest::Contains("got 11"), tessera::Error);
  CHECK_THROWS_WITH_AS(sample(tessera::ops::zeros({2, 5}), 1.0, 0, PhiloxKey{}, 0),
                       doctest::Contains("1-d floating tensor [V], got [2, 5]"), tessera::Error);
  CHECK_THROWS_WITH_AS(sample(tessera::ops::zeros({0}), 1.0, 0, PhiloxKey{}, 0),
                       doctest::Contains("non-empty"), tessera::Error);
  CHECK_THROWS_WITH_AS(
      sample(tessera::ops::zeros({4}, {.dtype = tessera::DType::i64}), 1.0, 0, PhiloxKey{}, 0),
      doctest::Contains("i64"), tessera::Error);
  CHECK_THROWS_AS(sample(Tensor(), 1.0, 0, PhiloxKey{}, 0), tessera::Error);
  CHECK_THROWS_WITH_AS(sample(logits_of({0.0f, std::nanf(""), 1.0f}), 1.0, 0, PhiloxKey{}, 0),
                       doctest::Contains("of token 1"), tessera::Error);
  CHECK_THROWS_WITH_AS(
      sample(logits_of({0.0f, std::numeric_limits<float>::infinity()}), 0.0, 0, PhiloxKey{}, 0),
      doctest::Contains("of token 1"), tessera::Error);
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(sample(logits_of({minus_infinity, minus_infinity}), 1.0, 0, PhiloxKey{}, 0),
                       doctest::Contains("all 2 logits are -inf"), tessera::Error);
}

// ---- generation -------------------------------------------------------------------------------

TEST_CASE("generate: the prompt plus max_new_tokens tokens, the same for the same key") {
  auto model = seeded_model(GPTConfig::preset("nano"), 5);
  const std::vector<uint32_t> prompt = tessera::train::text_to_byte_tokens("Hello");
  const tessera::train::SamplingOptions options{.temperature = 1.0, .top_k = 0, .key = PhiloxKey{99, 0}};
  const std::vector<uint32_t> a = continue_prompt(*model, prompt, 40, options);
  REQUIRE(a.size() == prompt.size() + 40);
  CHECK(std::equal(prompt.begin(), prompt.end(), a.begin()));
  CHECK(continue_prompt(*model, prompt, 40, options) == a);
  tessera::train::SamplingOptions other = options;
  other.key.seed = 100;
  CHECK(continue_prompt(*model, prompt, 40, other) != a);
  CHECK(continue_prompt(*model, prompt, 0, options) == prompt);
  // New token i always uses draw i: a shorter run is a prefix of a longer one.
  const std::vector<uint32_t> shorter = continue_prompt(*model, prompt, 25, options);
  CHECK(std::equal(shorter.begin(), shorter.end(), a.begin()));
  CHECK(model->is_training());  // mode restored
}

TEST_CASE("generate: beyond block_size the context is the last block_size tokens, in eval mode") {
  GPTConfig config = GPTConfig::preset("nano");
  config.block_size = 8;
  config.dropout = 0.5;  // would change every step if generation ran in train mode
  auto model = seeded_model(config, 17);
  const std::vector<uint32_t> prompt = tessera::train::text_to_byte_tokens("abcde");
  const tessera::train::SamplingOptions greedy{.temperature = 0.0, .top_k = 0, .key = PhiloxKey{}};
  const std::vector<uint32_t> tokens = continue_prompt(*model, prompt, 20, greedy);
  REQUIRE(tokens.size() == 25);
  CHECK(model->is_training());

  model->eval();
  for (size_t position = prompt.size(); position < tokens.size(); ++position) {
    INFO("position " << position);
    const size_t begin = position > 8 ? position - 8 : 0;
    const std::vector<uint32_t> context(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                        tokens.begin() + static_cast<std::ptrdiff_t>(position));
    CHECK(tokens[position] == greedy_next(*model, context));
  }
  // A prompt longer than block_size is cropped too.
  const std::vector<uint32_t> long_prompt = tessera::train::text_to_byte_tokens("a prompt longer than eight bytes");
  const std::vector<uint32_t> continued = continue_prompt(*model, long_prompt, 3, greedy);
  REQUIRE(continued.size() == long_prompt.size() + 3);
  const std::vector<uint32_t> last_eight(long_prompt.end() - 8, long_prompt.end());
  CHECK(continued[long_prompt.size()] == greedy_next(*model, last_eight));
  CHECK_FALSE(model->is_training());  // eval stays eval
}

TEST_CASE("generate: bad inputs are errors") {
  auto model = seeded_model(GPTConfig::preset("nano"), 1);
  const tessera::train::SamplingOptions options;
  auto generate = [&](std::vector<std::vector<uint32_t>> prompts, tessera::train::GenerationOptions generation) {
    return tessera::train::generate(*model, prompts, generation);
  };
  CHECK_THROWS_WITH_AS(generate({{65}, {}}, {.max_new_tokens = 5}), doctest::Contains("prompt 1 is empty"),
                       tessera::Error);
  CHECK_THROWS_WITH_AS(generate({}, {.max_new_tokens = 5}), doctest::Contains("no prompts"), tessera::Error);
  CHECK_THROWS_WITH_AS(
      generate({{65, 256}}, {.max_new_tokens = 5}),
      doctest::Contains("prompt 0: token 256 at position 1 is outside the model's vocabulary [0, 256)"),
      tessera::Error);
  CHECK_THROWS_WITH_AS(generate({{65}}, {.max_new_tokens = -1}), doctest::Contains("max_new_tokens"), tessera::Error);
  CHECK_THROWS_WITH_AS(generate({{65}}, {.max_new_tokens = 0, .sampling = {.temperature = -1.0, .top_k = 0}}),
                       doctest::Contains("temperature must be"), tessera::Error);
  CHECK_THROWS_WITH_AS(generate({{65}}, {.max_new_tokens = 0, .sampling = {.temperature = 1.0, .top_k = 257}}),
                       doctest::Contains("top_k must be in [0, vocab size 256]"), tessera::Error);
  CHECK_THROWS_WITH_AS(generate({{65}}, {.max_new_tokens = 0, .sampling = {.temperature = 1.0, .top_k = -3}}),
                       doctest::Contains("top_k"), tessera::Error);
  CHECK_THROWS_WITH_AS(generate({{65}}, {.max_new_tokens = 0, .sampling = {.top_p = 0.0}}),
                       doctest::Contains("top_p must be in (0, 1] (1 = all), got 0"), tessera::Error);
  CHECK_THROWS_WITH_AS(generate({{65}}, {.max_new_tokens = 1, .stop_tokens = {10, 300}}),
                       doctest::Contains("stop token 300 is outside the model's vocabulary [0, 256)"), tessera::Error);
  CHECK(model->is_training());  // untouched
}

TEST_CASE("generate: tokens are uint32, for vocabularies past 65536 (Llama 3 has 128,256)") {
  GPTConfig wide = GPTConfig::preset("nano");
  wide.vocab_size = 70000;
  auto model = seeded_model(wide, 1);
  const tessera::train::SamplingOptions hot{.temperature = 100.0, .top_k = 0, .key = PhiloxKey{5, 0}};
  const std::vector<uint32_t> tokens = continue_prompt(*model, {69999, 65}, 200, hot);
  REQUIRE(tokens.size() == 202);
  CHECK(tokens.front() == 69999);
  // At this temperature the draws spread over the vocabulary: 6% of it is past 65535.
  CHECK(std::any_of(tokens.begin() + 2, tokens.end(), [](uint32_t token) { return token > 65535; }));
  CHECK(std::all_of(tokens.begin(), tokens.end(), [](uint32_t token) { return token < 70000; }));
}

// ---- byte text --------------------------------------------------------------------------------

TEST_CASE("byte tokens: text in, printable text out") {
  const std::string text = "Fortune: \"a\tb\"\nnaïve €1 \xF0\x9F\x98\x80 ok~";  // 2-, 3- and 4-byte UTF-8
  const std::vector<uint32_t> tokens = tessera::train::text_to_byte_tokens(text);
  CHECK(tokens.size() == text.size());
  CHECK(tokens[10] == 'a');
  CHECK(tessera::train::byte_tokens_to_printable(tokens) == text);

  // Control bytes, DEL, C1 controls and broken UTF-8 are escaped byte by byte.
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{'a', 0, 7, '\r', 27, 127, 'b'}) ==
        "a\\x00\\x07\\x0d\\x1b\\x7fb");
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0xC2, 0x85}) == "\\xc2\\x85");  // U+0085 (C1)
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0xC3}) == "\\xc3");             // truncated
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0xC3, 'x'}) == "\\xc3x");
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0xC0, 0x80}) == "\\xc0\\x80");             // overlong NUL
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0xED, 0xA0, 0x80}) == "\\xed\\xa0\\x80");  // surrogate
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0xF4, 0x90, 0x80, 0x80}) ==
        "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{0x80, 'z', 0xFF}) == "\\x80z\\xff");
  CHECK_THROWS_WITH_AS(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{'a', 300}),
                       doctest::Contains("token 300 at position 1 is not a byte"), tessera::Error);
}

TEST_CASE("byte tokens: the escaped text decodes back to every byte, and a backslash is told from an escape") {
  // The text "\xff" and the byte 0xff print differently.
  CHECK(tessera::train::byte_tokens_to_printable(tessera::train::text_to_byte_tokens("a\\xff")) == "a\\\\xff");
  CHECK(tessera::train::byte_tokens_to_printable(std::vector<uint32_t>{'a', 0xFF}) == "a\\xff");
  // All 256 values alone, in order, and every pair (which covers the starts of UTF-8 sequences).
  std::vector<uint32_t> all(256);
  for (uint32_t value = 0; value < 256; ++value) all[value] = value;
  const std::string bytes = tessera::train::byte_tokens_to_bytes(all);
  REQUIRE(bytes.size() == 256);
  for (size_t i = 0; i < 256; ++i) CHECK(static_cast<uint8_t>(bytes[i]) == i);
  CHECK(tessera::train::printable_to_bytes(tessera::train::byte_tokens_to_printable(all)) == bytes);
  for (uint32_t first = 0; first < 256; ++first) {
    for (uint32_t second = 0; second < 256; ++second) {
      const std::vector<uint32_t> pair = {first, second};
      if (tessera::train::printable_to_bytes(tessera::train::byte_tokens_to_printable(pair)) != tessera::train::byte_tokens_to_bytes(pair)) {
        FAIL("the pair " << first << ", " << second << " does not round-trip");
      }
    }
  }
  CHECK_THROWS_WITH_AS(tessera::train::printable_to_bytes("a\\q"), doctest::Contains("the backslash at position 1"),
                       tessera::Error);
  CHECK_THROWS_AS(tessera::train::printable_to_bytes("\\x4"), tessera::Error);  // cut short
  CHECK_THROWS_AS(tessera::train::printable_to_bytes("\\xg0"), tessera::Error);
}

// ---- loading a trained model ------------------------------------------------------------------

namespace {

tessera::train::TrainConfig nano_run() {
  tessera::train::TrainConfig config;
  config.preset = "nano";
  config.model = GPTConfig::preset("nano");
  config.seq_len = config.model.block_size;
  config.batch = 2;
  config.steps = 7;
  config.warmup = 0;
  config.data = tessera::train::kSyntheticData;
  config.seed = 2024;
  return config;
}

json training_state_of(const tessera::train::TrainConfig& config, int64_t step) {
  return {
      {"config", {{"model", tessera::train::model_config_to_json(config.model)}, {"train", tessera::train::train_config_to_json(config)}}},
      {"step", step}};
}

}  // namespace

TEST_CASE("a checkpoint saved on 3 FSDP ranks loads whole in one process; a root gives its newest") {
  TempDir root;
  tessera::train::TrainConfig config = nano_run();
  config.nproc = 3;
  // Step 7 holds the model of config.seed; step 3 an older one.
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    auto model = tessera::train::build_model_meta(config, distributed);
    auto optimizer = tessera::train::build_optimizer(*model, config);
    tessera::checkpoint::save(tessera::train::checkpoint_path(root.path.string(), 7),
                              tessera::checkpoint::training_state_dict(*model, *optimizer),
                              {.training_state = training_state_of(config, 7), .sync = false});
    model->reset_parameters(config.seed + 1);
    tessera::checkpoint::save(tessera::train::checkpoint_path(root.path.string(), 3),
                              tessera::checkpoint::training_state_dict(*model, *optimizer),
                              {.training_state = training_state_of(config, 3), .sync = false});
  });

  const auto reference = tessera::train::build_model_meta(config, std::nullopt);  // the same bits, unsharded
  const tessera::train::LoadedModel latest = tessera::train::load_model_from_checkpoint(root.path.string());
  CHECK(latest.source == tessera::train::checkpoint_path(root.path.string(), 7));
  CHECK(latest.step == 7);
  CHECK_FALSE(latest.model->is_training());
  CHECK(check_same_parameters(*latest.model, *reference) == 16);  // nano: 2 + 12 + 2

  const tessera::train::LoadedModel older =
      tessera::train::load_model_from_checkpoint(tessera::train::checkpoint_path(root.path.string(), 3));
  CHECK(older.step == 3);
  CHECK(dynamic_cast<tessera::nn::GPT&>(*older.model).wte().parameter("weight")->tensor().to_vector<float>() !=
        dynamic_cast<tessera::nn::GPT&>(*reference).wte().parameter("weight")->tensor().to_vector<float>());

  // What generate prints comes from exactly those weights.
  const tessera::train::SamplingOptions options{.temperature = 0.9, .top_k = 20, .key = PhiloxKey{1337, 0}};
  const std::vector<uint32_t> prompt = tessera::train::text_to_byte_tokens("The ");
  CHECK(continue_prompt(*latest.model, prompt, 30, options) ==
        continue_prompt(*reference, prompt, 30, options));
}

TEST_CASE("loading a checkpoint: a config that does not match the weights, or none, is an error") {
  TempDir root;
  const tessera::train::TrainConfig config = nano_run();
  auto model = tessera::train::build_model_meta(config, std::nullopt);
  const auto state = tessera::checkpoint::model_state(*model);

  tessera::train::TrainConfig deeper = config;
  deeper.model.n_layer = 2;
  tessera::checkpoint::save(root / "deeper", state, {.training_state = training_state_of(deeper, 1), .sync = false});
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_checkpoint(root / "deeper"),
                       doctest::Contains("lacks parameters of the model its config describes: [\"model.blocks.1."),
                       tessera::Error);

  tessera::train::TrainConfig deep = config;
  deep.model.n_layer = 2;
  auto deep_model = tessera::train::build_model_meta(deep, std::nullopt);
  tessera::checkpoint::save(root / "shallower", tessera::checkpoint::model_state(*deep_model),
                            {.training_state = training_state_of(config, 1), .sync = false});
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_checkpoint(root / "shallower"),
                       doctest::Contains("holds parameters its model config does not have"), tessera::Error);

  tessera::checkpoint::save(root / "no-config", state, {.training_state = {{"step", 4}}, .sync = false});
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_checkpoint(root / "no-config"),
                       doctest::Contains("training_state has no \"config\" object"), tessera::Error);

  json bad = training_state_of(config, 1);
  bad["config"]["model"]["n_head"] = "two";
  tessera::checkpoint::save(root / "bad-config", state, {.training_state = bad, .sync = false});
  CHECK_THROWS_WITH_AS(
      tessera::train::load_model_from_checkpoint(root / "bad-config"),
      doctest::Contains("training_state.config.model: model config: field 'n_head' must be an integer"),
      tessera::Error);

  json no_step = training_state_of(config, 1);
  no_step.erase("step");
  tessera::checkpoint::save(root / "no-step", state, {.training_state = no_step, .sync = false});
  CHECK_FALSE(tessera::train::load_model_from_checkpoint(root / "no-step").step.has_value());

  json bad_step = training_state_of(config, 1);
  bad_step["step"] = "one";
  tessera::checkpoint::save(root / "bad-step", state, {.training_state = bad_step, .sync = false});
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_checkpoint(root / "bad-step"),
                       doctest::Contains("training_state.step must be a non-negative integer, got \"one\""),
                       tessera::Error);

  fs::create_directories(root / "empty");
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_checkpoint(root / "empty"),
                       doctest::Contains("neither a checkpoint (no metadata.json)"), tessera::Error);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_checkpoint(root / "absent"), doctest::Contains("not a directory"),
                       tessera::Error);
}

TEST_CASE("a .safetensors file with the config in its metadata loads; without it, an error") {
  TempDir dir;
  const tessera::train::TrainConfig config = nano_run();
  auto model = tessera::train::build_model_meta(config, std::nullopt);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, parameter] : model->named_parameters()) tensors.emplace_back(name, parameter->tensor());
  const std::string config_text = tessera::train::model_config_to_json(config.model).dump();
  tessera::checkpoint::write_safetensors(dir / "model.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, config_text}, {tessera::train::kStepMetadataKey, "12"}},
                                         false);

  const tessera::train::LoadedModel loaded = tessera::train::load_model_from_safetensors(dir / "model.safetensors");
  CHECK(loaded.source == dir / "model.safetensors");
  CHECK(loaded.step == 12);
  CHECK_FALSE(loaded.model->is_training());
  CHECK(check_same_parameters(*loaded.model, *model) == 16);

  tessera::checkpoint::write_safetensors(dir / "no-step.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, config_text}}, false);
  CHECK_FALSE(tessera::train::load_model_from_safetensors(dir / "no-step.safetensors").step.has_value());
  tessera::checkpoint::write_safetensors(dir / "bad-step.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, config_text}, {tessera::train::kStepMetadataKey, "12a"}},
                                         false);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_safetensors(dir / "bad-step.safetensors"),
                       doctest::Contains("tessera.step must be a non-negative integer, got '12a'"), tessera::Error);

  tessera::checkpoint::write_safetensors(dir / "bare.safetensors", tensors, {}, false);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_safetensors(dir / "bare.safetensors"),
                       doctest::Contains("__metadata__ has no \"tessera.gpt_config\" key"), tessera::Error);
  tessera::checkpoint::write_safetensors(dir / "garbled.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, "{n_layer"}}, false);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_safetensors(dir / "garbled.safetensors"),
                       doctest::Contains("tessera.gpt_config: not valid JSON"), tessera::Error);
  GPTConfig wider = config.model;
  wider.n_embd = 32;
  tessera::checkpoint::write_safetensors(dir / "mismatch.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, tessera::train::model_config_to_json(wider).dump()}},
                                         false);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_safetensors(dir / "mismatch.safetensors"),
                       doctest::Contains("does not hold the model its config describes: wte.weight: shape [256, 16] "
                                         "in the file, [256, 32] in its model config"),
                       tessera::Error);
  // An edited config asking for a model far larger than the weights is refused before anything is allocated:
  // the same names at a width of 2^20 (the bound), and a width beyond it.
  GPTConfig enormous = config.model;
  enormous.n_embd = tessera::train::kMaxModelWidth;
  enormous.n_head = 1;
  tessera::checkpoint::write_safetensors(dir / "enormous.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, tessera::train::model_config_to_json(enormous).dump()}},
                                         false);
  const int64_t live = tessera::memory_stats(tessera::kCPU).live_bytes;
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_safetensors(dir / "enormous.safetensors"),
                       doctest::Contains("in the file, [256, 1048576] in its model config"), tessera::Error);
  CHECK(tessera::memory_stats(tessera::kCPU).live_bytes == live);
  enormous.n_embd = 2 * tessera::train::kMaxModelWidth;
  tessera::checkpoint::write_safetensors(dir / "beyond.safetensors", tensors,
                                         {{tessera::train::kGptConfigMetadataKey, tessera::train::model_config_to_json(enormous).dump()}},
                                         false);
  CHECK_THROWS_WITH_AS(tessera::train::load_model_from_safetensors(dir / "beyond.safetensors"),
                       doctest::Contains("model config: n_embd must be at most 1048576, got 2097152"),
                       tessera::Error);
}

// ---- Llama ------------------------------------------------------------------------------------

namespace {

using tessera::nn::LlamaConfig;

LlamaConfig unusual_llama_config() {
  LlamaConfig config;
  config.vocab_size = 97;
  config.block_size = 48;
  config.n_layer = 3;
  config.n_head = 6;
  config.n_kv_head = 3;
  config.n_embd = 48;
  config.ffn_hidden = 100;
  config.rope_theta = 5e5;
  config.norm_eps = 1e-6;
  return config;
}

}  // namespace

TEST_CASE("model config JSON: a Llama's fields and family round-trip; the family is checked first") {
  const LlamaConfig config = unusual_llama_config();
  const json encoded = tessera::train::model_config_to_json(config);
  std::set<std::string> keys;
  for (const auto& [key, value] : encoded.items()) keys.insert(key);
  CHECK(keys == std::set<std::string>{"family", "vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd",
                                      "ffn_hidden", "rope_theta", "norm_eps"});
  CHECK(encoded.at("family") == "llama");
  const tessera::train::ModelConfig decoded = tessera::train::model_config_from_json(json::parse(encoded.dump()), "test");
  REQUIRE(std::holds_alternative<LlamaConfig>(decoded));
  CHECK(tessera::train::model_config_to_json(decoded) == encoded);
  CHECK(std::get<LlamaConfig>(decoded).rope_theta == 5e5);
  for (const std::string& preset : LlamaConfig::preset_names()) {
    CAPTURE(preset);
    const json preset_json = tessera::train::model_config_to_json(LlamaConfig::preset(preset));
    CHECK(tessera::train::model_config_to_json(tessera::train::model_config_from_json(preset_json, preset)) == preset_json);
  }
  // A GPT's JSON names no family; one that says "gpt" reads the same.
  json gpt_json = tessera::train::model_config_to_json(unusual_config());
  CHECK(gpt_json.count("family") == 0);
  CHECK(tessera::train::model_family_from_json(gpt_json, "test") == tessera::train::ModelFamily::gpt);
  gpt_json["family"] = "gpt";
  check_same_config(gpt_config_from_json(gpt_json, "test"), unusual_config());

  const std::string source = "ckpt/metadata.json";
  auto error_of = [&source](const json& value) -> std::string {
    try {
      tessera::train::model_config_from_json(value, source);
    } catch (const tessera::Error& error) {
      return error.what();
    }
    return "no error";
  };
  for (const auto& [field, value] : encoded.items()) {
    INFO(field);
    json missing = encoded;
    missing.erase(field);
    // Without its family, a Llama's JSON is a GPT's with unknown fields.
    const std::string expected = field == "family" ? "unknown field 'ffn_hidden'" : "field '" + field + "' is missing";
    CHECK(error_of(missing).find(expected) != std::string::npos);
  }
  json family = encoded;
  family["family"] = 3;
  CHECK(error_of(family).find("ckpt/metadata.json: model config: field 'family' must be a string, got integer 3") !=
        std::string::npos);
  family["family"] = "mamba";
  CHECK(error_of(family).find("unknown model family 'mamba' (known: gpt, llama)") != std::string::npos);
  json extra = encoded;
  extra["dropout"] = 0.0;
  CHECK(error_of(extra).find("unknown field 'dropout'") != std::string::npos);
  json uneven = encoded;
  uneven["n_kv_head"] = 4;
  CHECK(error_of(uneven).find("ckpt/metadata.json: model config: LlamaConfig: n_kv_head (4) must divide n_head (6)") !=
        std::string::npos);
  json theta = encoded;
  theta["rope_theta"] = "big";
  CHECK(error_of(theta).find("field 'rope_theta' must be a number") != std::string::npos);
}

TEST_CASE("a Llama trained on 2 FSDP ranks comes back from its checkpoint and its export with the trained logits") {
  TempDir dir;
  tessera::train::TrainConfig config = nano_run();
  config.preset = "llama-nano";
  config.llama = LlamaConfig::preset("llama-nano");
  config.seq_len = config.llama->block_size;
  config.nproc = 2;
  config.threads = 1;  // every rank, and the loaded models below: the same GEMM blocking
  config.steps = 3;
  const std::vector<int64_t> window = {84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114};  // "The quick br"
  const Tensor idx = tessera::ops::from_vector(window, {1, static_cast<int64_t>(window.size())});
  std::vector<float> trained_logits;
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
    for (int64_t step = 0; step < config.steps; ++step) trainer.train_step();
    {
      tessera::autograd::NoGradGuard no_grad;
      const Tensor logits = trainer.model()(idx);  // every rank all-gathers; the logits are whole on each
      if (distributed.rank() == 0) trained_logits = logits.to_vector<float>();
    }
    tessera::checkpoint::save(dir / "step-3", trainer.state_dict(),
                              {.group = distributed.world, .training_state = trainer.training_state(), .sync = false});
    trainer.export_to(dir / "llama.safetensors");
  });
  REQUIRE(trained_logits.size() == window.size() * 256);

  const tessera::fsdp::testing::IntraOpThreads threads(1);
  const tessera::train::LoadedModel from_checkpoint = tessera::train::load_model_from_checkpoint(dir / "step-3");
  const tessera::train::LoadedModel from_export = tessera::train::load_model_from_safetensors(dir / "llama.safetensors");
  for (const tessera::train::LoadedModel* loaded : {&from_checkpoint, &from_export}) {
    CAPTURE(loaded->source);
    CHECK(loaded->step == 3);
    CHECK(dynamic_cast<tessera::nn::Llama*>(loaded->model.get()) != nullptr);
    CHECK(tessera::train::family_of(loaded->config) == tessera::train::ModelFamily::llama);
    CHECK_FALSE(loaded->model->is_training());
    tessera::autograd::NoGradGuard no_grad;
    CHECK((*loaded->model)(idx).to_vector<float>() == trained_logits);
  }
  CHECK(check_same_parameters(*from_checkpoint.model, *from_export.model) == 2 + 9 + 1);  // nano: 1 block
  const tessera::train::SamplingOptions options{.temperature = 0.9, .top_k = 20, .key = PhiloxKey{1337, 0}};
  const std::vector<uint32_t> prompt = tessera::train::text_to_byte_tokens("The ");
  const std::vector<uint32_t> text = continue_prompt(*from_export.model, prompt, 40, options);
  CHECK(text.size() == prompt.size() + 40);
  CHECK(continue_prompt(*from_checkpoint.model, prompt, 40, options) == text);
}
