// Checkpoints in the training example: a run resumed from step k makes
// bitwise the losses, weights and optimizer state of the uninterrupted run,
// on the same world size and on another one that does the same arithmetic;
// export and --init-from carry the weights; mismatched resumes are errors.
// A Llama's too, and a checkpoint or export of another model family is
// refused by name.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/checkpoint/temp_dir.h"
#include "train/checkpoint_manager.h"
#include "train/huggingface/hf_checkpoint.h"
#include "train/run_record.h"
#include "train/trainer.h"
#include "train/training_run.h"

namespace fs = std::filesystem;
namespace checkpoint = tessera::checkpoint;
using tessera::train::TrainConfig;

using tessera::checkpoint::testing::TempDir;

namespace {

// A small model with dropout, so the RNG state matters for exact resume.
TrainConfig resume_config(int nproc, int64_t grad_accum, double dropout) {
  TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("tiny");
  config.model.vocab_size = 97;
  config.model.dropout = dropout;
  config.data = tessera::train::kSyntheticData;
  config.seq_len = 16;
  config.batch = 4;
  config.grad_accum = grad_accum;
  config.nproc = nproc;
  config.steps = 6;
  config.warmup = 2;
  config.eval_every = 0;
  config.ckpt_every = 3;
  return config;
}

tessera::train::TrainSummary run_to_summary(TrainConfig config) {
  std::ostringstream log;
  tessera::train::TrainSummary summary = tessera::train::train(config, log);
  INFO(log.str());
  return summary;
}

// Every tensor of a checkpoint, whole, as f64 values (loaded in this process).
std::map<std::string, std::vector<double>> checkpoint_values(const std::string& dir) {
  std::ifstream file(fs::path(dir) / checkpoint::kMetadataFile);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const checkpoint::CheckpointMetadata metadata = checkpoint::CheckpointMetadata::parse(text, dir);
  checkpoint::DistributedStateDict state;
  for (const auto& [name, info] : metadata.tensors) {
    state[name] = tessera::ops::zeros(info.global_shape, {.dtype = info.dtype});
  }
  checkpoint::load(dir, state);
  std::map<std::string, std::vector<double>> values;
  for (const auto& [name, entry] : state) values[name] = std::get<tessera::Tensor>(entry).to_vector<double>();
  return values;
}

// A new root holding `root`'s run record and its checkpoint `step` only, as
// if the run had crashed right after saving it.
void copy_run(const std::string& root, const std::string& copy, int64_t step) {
  fs::create_directories(copy);
  fs::copy(fs::path(root) / tessera::train::kRunRecordFile, fs::path(copy) / tessera::train::kRunRecordFile);
  fs::copy(tessera::train::checkpoint_path(root, step), tessera::train::checkpoint_path(copy, step));
}

}  // namespace

namespace {

// `whole` (checkpoints every 3 of 6 steps) run through, and again from its
// step 3 on the same layout (as if it had crashed at step 4, resumed
// without async saves): the same last 3 losses and the same step-6
// checkpoint, bitwise; returns that checkpoint's values.
std::map<std::string, std::vector<double>> check_resume_on_same_layout(TrainConfig whole, const TempDir& tmp) {
  whole.deterministic = true;
  whole.ckpt_dir = tmp / "whole";
  const tessera::train::TrainSummary uninterrupted = run_to_summary(whole);
  REQUIRE(uninterrupted.losses.size() == 6);

  copy_run(tmp / "whole", tmp / "resumed", 3);
  TrainConfig resumed_config = whole;
  resumed_config.ckpt_dir = tmp / "resumed";
  resumed_config.async_ckpt = false;
  resumed_config.resume = true;
  const tessera::train::TrainSummary resumed = run_to_summary(resumed_config);
  CHECK(resumed.first_step == 4);
  REQUIRE(resumed.losses.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(resumed.losses[i] == uninterrupted.losses[i + 3]);

  const auto expected = checkpoint_values(tessera::train::checkpoint_path(tmp / "whole", 6));
  const auto actual = checkpoint_values(tessera::train::checkpoint_path(tmp / "resumed", 6));
  if (!whole.llama) {
    CHECK(expected.count("model.wte.weight") == 1);
    CHECK(expected.count("optim.blocks.1.mlp.fc.weight.exp_avg_sq") == 1);
  }
  CHECK(expected.size() == actual.size());
  for (const auto& [name, values] : expected) {
    CAPTURE(name);
    CHECK(actual.at(name) == values);
  }
  return expected;
}

}  // namespace

TEST_CASE("resume on the same world size: bitwise the losses, weights and AdamW state of the uninterrupted run") {
  TempDir tmp;
  TrainConfig whole = resume_config(2, 2, 0.1);
  whole.async_ckpt = true;  // the uninterrupted run's checkpoints at steps 3 and 6 written in the background
  check_resume_on_same_layout(whole, tmp);
}

TEST_CASE("resume with --tp 2 on (shard 2, tp 2): bitwise the losses, weights and AdamW state of the run through") {
  TempDir tmp;
  // Dropout on: each tp rank draws its slice of the mask from its generator,
  // whose state the checkpoint carries per rank.
  TrainConfig whole = resume_config(4, 1, 0.1);
  whole.tp = 2;
  const auto saved = check_resume_on_same_layout(whole, tmp);
  // The checkpoint holds the logical tensors: the fused qkv whole.
  CHECK(saved.at("model.blocks.0.attn.qkv.weight").size() == 3 * 64 * 64);
}

// `whole` (4 ranks x 1 micro-batch, checkpoints every 3 of 6 steps), resumed
// from its step 3 on 1 rank x 4, makes bitwise its last 3 losses and its
// step-6 checkpoint, `optimizer_entry` included. 4 ranks add their
// micro-batches' gradients in rank order and divide by 4; 1 rank adds the
// same micro-batches in the same order and scales by 1/4: the same bits, so
// the checkpoint's resharding (vocab 97 in rows of 25, 25, 25 and 22, onto
// one rank) must carry the weights, the AdamW moments, the step and the data
// position exactly. Clipping is off, as its norm sums per shard first, and
// every rank runs one intra-op thread (Eigen's GEMM blocks by the thread count).
void check_resume_on_one_rank(TrainConfig whole, const TempDir& tmp, const std::string& optimizer_entry) {
  whole.clip = 0.0;
  whole.threads = 1;
  whole.ckpt_dir = tmp / "whole";
  const tessera::train::TrainSummary uninterrupted = run_to_summary(whole);

  copy_run(tmp / "whole", tmp / "resumed", 3);
  TrainConfig narrower = whole;
  narrower.nproc = 1;
  narrower.grad_accum = 4;  // the same global batch
  narrower.ckpt_dir = tmp / "resumed";
  narrower.resume = true;
  const tessera::train::TrainSummary resumed = run_to_summary(narrower);
  CHECK(resumed.first_step == 4);
  REQUIRE(resumed.losses.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(resumed.losses[i] == uninterrupted.losses[i + 3]);
  const auto expected = checkpoint_values(tessera::train::checkpoint_path(tmp / "whole", 6));
  const auto actual = checkpoint_values(tessera::train::checkpoint_path(tmp / "resumed", 6));
  CHECK(expected.count(optimizer_entry) == 1);
  CHECK(expected.size() == actual.size());
  for (const auto& [name, values] : expected) {
    CAPTURE(name);
    CHECK(actual.at(name) == values);
  }
}

TEST_CASE("resume on another world size: 4 ranks x 1 micro-batch, resumed on 1 rank x 4, bitwise") {
  TempDir tmp;
  check_resume_on_one_rank(resume_config(4, 1, 0.0), tmp, "optim.blocks.1.mlp.fc.weight.exp_avg");
}

// `config` (on several ranks) trains 2 steps, checkpoints and exports; the
// export records the step and the model config, holds every parameter the
// checkpoint holds, and `plain` (one rank, the same model) starts from
// exactly the checkpoint's weights with --init-from. Returns the export's
// model config.
nlohmann::json check_export_and_init_from(TrainConfig config, const TrainConfig& plain, const TempDir& tmp) {
  config.steps = 2;
  config.ckpt_dir = tmp / "ckpt";
  config.export_path = tmp / "model.safetensors";
  run_to_summary(config);
  const checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(tmp / "model.safetensors");
  CHECK(header.metadata.at("tessera.step") == "2");
  REQUIRE(header.metadata.count("tessera.gpt_config") == 1);
  const auto saved = checkpoint_values(tessera::train::checkpoint_path(tmp / "ckpt", 2));
  size_t parameters = 0;
  for (const auto& [name, values] : saved) parameters += name.rfind("model.", 0) == 0;
  CHECK(header.entries.size() == parameters);

  // The export, loaded into one plain process, is the step-2 checkpoint's weights.
  tessera::train::Trainer trainer(plain, tessera::train::build_data(plain));
  trainer.init_from(tmp / "model.safetensors");
  for (const auto& [name, entry] : trainer.state_dict()) {
    if (name.rfind("model.", 0) != 0) continue;
    CAPTURE(name);
    CHECK(std::get<tessera::Tensor>(entry).to_vector<double>() == saved.at(name));
  }
  return nlohmann::json::parse(header.metadata.at("tessera.gpt_config"));
}

TEST_CASE("export writes the trained weights as safetensors, and --init-from starts from them on another world size") {
  TempDir tmp;
  check_export_and_init_from(resume_config(3, 1, 0.0), resume_config(1, 1, 0.0), tmp);
}

TEST_CASE("resume errors: another model shape, another seed (refused by the root's run record), no checkpoint yet") {
  TempDir tmp;
  TrainConfig config = resume_config(1, 1, 0.0);
  config.steps = 1;
  config.warmup = 0;
  config.ckpt_dir = tmp / "ckpt";
  run_to_summary(config);

  TrainConfig wider = config;
  wider.steps = 2;
  wider.resume = true;
  wider.model.n_embd = 96;
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(tessera::train::train(wider, log), doctest::Contains("not to this launch: model: the run's"),
                       tessera::Error);
  TrainConfig reseeded = config;
  reseeded.steps = 2;
  reseeded.resume = true;
  reseeded.seed = 99;
  CHECK_THROWS_WITH_AS(tessera::train::train(reseeded, log), doctest::Contains("seed: the run's 1337, this launch's 99"),
                       tessera::Error);
  CHECK(log.str().find("| loss") == std::string::npos);  // refused before the first step

  // An empty directory: a fresh start, said so.
  TrainConfig fresh = config;
  fresh.ckpt_dir = tmp / "empty";
  fresh.resume = true;
  std::ostringstream fresh_log;
  const tessera::train::TrainSummary summary = tessera::train::train(fresh, fresh_log);
  CHECK(summary.first_step == 1);
  CHECK(fresh_log.str().find("no checkpoint of this run in") != std::string::npos);
  // Resuming a finished run trains nothing.
  TrainConfig finished = config;
  finished.resume = true;
  std::ostringstream finished_log;
  CHECK(tessera::train::train(finished, finished_log).losses.empty());
  CHECK(finished_log.str().find("nothing to train") != std::string::npos);
}

// ---- Llama ---------------------------------------------------------------------------------------

namespace {

// resume_config's run with llama-tiny (vocab 97) in place of the GPT.
TrainConfig llama_resume_config(int nproc, int64_t grad_accum) {
  TrainConfig config = resume_config(nproc, grad_accum, 0.0);
  config.preset = "llama-tiny";
  config.llama = tessera::nn::LlamaConfig::preset("llama-tiny");
  config.llama->vocab_size = 97;
  return config;
}

}  // namespace

TEST_CASE("llama: resume on another world size: 4 ranks x 1 micro-batch, resumed on 1 rank x 4, bitwise") {
  TempDir tmp;
  check_resume_on_one_rank(llama_resume_config(4, 1), tmp, "optim.layers.1.feed_forward.w2.weight.exp_avg");
  // The checkpoint records the family, and no RoPE table (a buffer rebuilt by to_empty).
  const auto saved = checkpoint_values(tessera::train::checkpoint_path(tmp / "whole", 6));
  CHECK(saved.count("model.output.weight") == 1);
  for (const auto& [name, values] : saved) CHECK(name.find("rope") == std::string::npos);
  const checkpoint::CheckpointMetadata metadata =
      checkpoint::read_metadata(tessera::train::checkpoint_path(tmp / "whole", 6));
  CHECK(metadata.training_state.at("config").at("model").at("family") == "llama");
}

TEST_CASE("llama: export on 3 ranks, --init-from on 1 rank, the config's family recorded") {
  TempDir tmp;
  const nlohmann::json model = check_export_and_init_from(llama_resume_config(3, 1), llama_resume_config(1, 1), tmp);
  CHECK(model.at("family") == "llama");
  CHECK(model.at("n_kv_head") == 2);
}

TEST_CASE("resume and --init-from refuse a model of another family, by name, before any weight is read") {
  TempDir tmp;
  TrainConfig llama = llama_resume_config(1, 1);
  llama.steps = 1;
  llama.warmup = 0;
  llama.ckpt_dir = tmp / "ckpt";
  llama.export_path = tmp / "llama.safetensors";
  run_to_summary(llama);

  // The same run resumed as a GPT: the root's run record names the family.
  TrainConfig as_gpt = resume_config(1, 1, 0.0);
  as_gpt.steps = 2;
  as_gpt.warmup = 0;
  as_gpt.ckpt_dir = llama.ckpt_dir;
  as_gpt.resume = true;
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(tessera::train::train(as_gpt, log),
                       doctest::Contains("the run saved there trains a llama model, this launch a gpt (--model gpt); "
                                         "resume it with --model llama"),
                       tessera::Error);
  CHECK(log.str().find("| loss") == std::string::npos);

  // The trainer itself, handed the checkpoint or the export.
  tessera::train::Trainer trainer(as_gpt, tessera::train::build_data(as_gpt));
  CHECK_THROWS_WITH_AS(trainer.resume_from(tessera::train::checkpoint_path(tmp / "ckpt", 1)),
                       doctest::Contains("the checkpoint holds a llama model, this run trains a gpt (--model gpt); "
                                         "pass --model llama"),
                       tessera::Error);
  CHECK_THROWS_WITH_AS(trainer.init_from(tmp / "llama.safetensors"),
                       doctest::Contains("llama.safetensors holds a llama model, this run trains a gpt"),
                       tessera::Error);
  CHECK(trainer.steps_done() == 0);

  // And the other way round: a GPT's export (no "family": a GPT) into a Llama run.
  TrainConfig gpt_run = resume_config(1, 1, 0.0);
  gpt_run.steps = 1;
  gpt_run.warmup = 0;
  gpt_run.ckpt_every = 0;
  gpt_run.export_path = tmp / "gpt.safetensors";
  run_to_summary(gpt_run);
  tessera::train::Trainer llama_trainer(llama_resume_config(1, 1), tessera::train::build_data(llama_resume_config(1, 1)));
  CHECK_THROWS_WITH_AS(llama_trainer.init_from(tmp / "gpt.safetensors"),
                       doctest::Contains("holds a gpt model, this run trains a llama (--model llama)"),
                       tessera::Error);
}

TEST_CASE("QLoRA: resume on 3 ranks is bitwise the run through; the checkpoint holds the packed base, the adapters") {
  TempDir tmp;
  const std::string golden = (std::filesystem::path(TESSERA_HF_GOLDEN_DIR) / "llama").string();
  TrainConfig config = resume_config(3, 1, 0.0);
  config.llama = std::get<tessera::nn::LlamaConfig>(tessera::train::read_hf_model_info(golden).config);
  config.preset = golden;
  config.init_from = golden;
  config.lora_rank = 2;
  config.nf4 = true;
  const auto saved = check_resume_on_same_layout(config, tmp);
  // The adapters and their AdamW state; the base packed (u8 rows), with no optimizer state.
  CHECK(saved.count("model.layers.1.attention.wq.lora_a") == 1);
  CHECK(saved.count("optim.layers.1.attention.wq.lora_b.exp_avg") == 1);
  CHECK(saved.count("optim.layers.1.attention.wq.weight.exp_avg") == 0);
  CHECK(saved.count("optim.tok_embeddings.weight.exp_avg") == 0);
  const checkpoint::CheckpointMetadata metadata =
      checkpoint::read_metadata(tessera::train::checkpoint_path(tmp / "whole", 6));
  CHECK(metadata.tensors.at("model.layers.1.attention.wq.weight").dtype == tessera::DType::u8);
}
