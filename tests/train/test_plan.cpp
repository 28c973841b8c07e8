// `train --plan` and `--plan --sweep`: the flags; a small run's plan against
// what its Trainer's FSDP model holds, sends and peaks at over real steps
// (GPT and Llama, uneven shards, HSDP, reshard_after_forward N, tensor
// parallelism alone, under FSDP and under HSDP), the bytes of a step equal to
// what the run logs as sent; GPT-2 XL and Llama 3 8B over 1,024 ranks
// printed in full, every parameter's row, with no rank started (Llama also
// with tp 8); and the sweep's table, JSON, CSV and SVG, each point the plan
// of its mesh, tp 1 to 8, with the output files' safety rules.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/fully_shard.h"
#include "tensor/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/fsdp/plan_text.h"
#include "tests/train/text_file.h"
#include "tests/train/train_outcome.h"
#include "train/flag_checks.h"
#include "train/model_family.h"
#include "train/run_plan.h"
#include "train/trainer.h"
#include "train/training_run.h"

using tessera::train::TrainConfig;
using tessera::checkpoint::testing::TempDir;
namespace fsdp = tessera::fsdp;
using tessera::train::testing::parse_flags;
using tessera::fsdp::testing::table_row;

using tessera::testing::read_file;

namespace {

// The tiny GPT on synthetic tokens, vocab 97: uneven shards on 2, 3 and 4 ranks.
TrainConfig small_run() {
  TrainConfig config;
  config.model = tessera::nn::GPTConfig::preset("tiny");
  config.model.vocab_size = 97;
  config.data = tessera::train::kSyntheticData;
  config.seq_len = 16;
  config.batch = 2;
  config.steps = 3;
  config.warmup = 0;
  config.eval_every = 0;
  return config;
}

TrainConfig preset_run(tessera::train::ModelFamily family, const std::string& preset, int nproc) {
  TrainConfig config;
  config.preset = preset;
  const tessera::train::ModelConfig model = tessera::train::preset_config(family, preset);
  if (family == tessera::train::ModelFamily::llama) {
    config.llama = std::get<tessera::nn::LlamaConfig>(model);
  } else {
    config.model = std::get<tessera::nn::GPTConfig>(model);
  }
  config.seq_len = 1024;
  config.batch = 1;
  config.nproc = nproc;
  config.plan = true;
  return config;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

TEST_CASE("train --plan: --sweep belongs to --plan, --sweep-out is .json or .csv, any --nproc plans") {
  TrainConfig config;
  std::string err;
  REQUIRE_FALSE(parse_flags({"--plan", "--preset", "gpt2-1558m", "--nproc", "1024"}, config, err));
  CHECK(config.plan);
  CHECK(config.nproc == 1024);
  REQUIRE_FALSE(parse_flags({"--plan", "--sweep", "--sweep-out", "s.csv", "--sweep-svg", "s.svg", "--hsdp", "4",
                             "--nproc", "64"},
                            config, err));
  CHECK(config.sweep);
  CHECK(config.sweep_out == "s.csv");
  CHECK(config.sweep_svg == "s.svg");
  CHECK(config.shard_ranks() == 16);

  const std::vector<std::pair<std::vector<const char*>, std::string>> refused = {
      {{"--sweep"}, "--sweep is part of the plan: pass --plan --sweep"},
      {{"--plan", "--sweep-out", "s.json"}, "--sweep-out and --sweep-svg write the sweep: pass --plan --sweep"},
      {{"--plan", "--sweep-svg", "s.svg"}, "--sweep-out and --sweep-svg write the sweep"},
      {{"--plan", "--sweep", "--sweep-out", "s.txt"},
       "--sweep-out s.txt: its extension picks the format, .json or .csv"},
      {{"--plan", "--sweep", "--sweep-out", ""}, "--sweep-out"},
      {{"--plan", "--nproc", "6", "--hsdp", "4"}, "--hsdp 4 must divide the 6 ranks"},
      {{"--plan", "--nproc", "4", "--reshard-after-forward", "3"}, "--reshard-after-forward 3 must divide"},
      {{"--plan", "--nproc", "2000000"}, "--nproc: must be in [1, 1048576], got 2000000"},
  };
  for (const auto& [args, message] : refused) {
    CAPTURE(message);
    TrainConfig refused_config;
    const std::optional<int> exit_code = parse_flags(args, refused_config, err);
    REQUIRE(exit_code.has_value());
    CHECK(*exit_code == tessera::train::kUsageExitCode);
    CHECK(err.find(message) != std::string::npos);
  }
}

TEST_CASE("train --plan of a small run is what its Trainer's FSDP model holds, sends and peaks at") {
  struct Case {
    const char* name;
    TrainConfig config;
  };
  std::vector<Case> cases;
  TrainConfig three = small_run();
  three.nproc = 3;
  three.grad_accum = 2;
  cases.push_back({"GPT, 3 ranks, 2 micro-batches", three});
  TrainConfig hsdp = small_run();
  hsdp.nproc = 4;
  hsdp.hsdp = 2;
  hsdp.param_dtype = tessera::DType::bf16;
  hsdp.reduce_dtype = tessera::DType::f32;
  cases.push_back({"GPT, HSDP 2 x 2, bf16 parameters", hsdp});
  TrainConfig regroup = small_run();
  regroup.nproc = 4;
  regroup.reshard_after_forward = fsdp::ReshardAfterForward::to_group_of(2);
  cases.push_back({"GPT, 4 ranks, reshard_after_forward 2", regroup});
  TrainConfig llama = small_run();
  llama.preset = "llama-tiny";
  llama.llama = tessera::nn::LlamaConfig::preset("llama-tiny");
  llama.llama->vocab_size = 97;
  llama.llama->ffn_hidden = 100;
  llama.nproc = 3;
  cases.push_back({"Llama, 3 ranks, F 100", llama});
  // Tensor parallelism: the vocabulary 97 splits unevenly over tp 2 (49 and
  // 48 rows), and FSDP splits the pieces unevenly again.
  TrainConfig tp_alone = small_run();
  tp_alone.nproc = 2;
  tp_alone.tp = 2;
  cases.push_back({"GPT, tp 2 alone", tp_alone});
  TrainConfig gpt_tp = small_run();
  gpt_tp.nproc = 6;
  gpt_tp.tp = 2;
  gpt_tp.grad_accum = 2;
  cases.push_back({"GPT, (shard 3, tp 2), 2 micro-batches", gpt_tp});
  TrainConfig async_tp = gpt_tp;
  async_tp.batch = 3;
  async_tp.async_tp = 2;  // 2 chunks of the 3 sequences: a call more per move, the same bytes
  cases.push_back({"GPT, (shard 3, tp 2), async in 2 chunks", async_tp});
  TrainConfig llama_tp = llama;
  llama_tp.nproc = 8;
  llama_tp.hsdp = 2;
  llama_tp.tp = 2;
  llama_tp.param_dtype = tessera::DType::bf16;
  llama_tp.reduce_dtype = tessera::DType::f32;
  cases.push_back({"Llama, (replicate 2, shard 2, tp 2), bf16 parameters", llama_tp});
  // Activation checkpointing: no FSDP collective more, the same unsharded
  // peak; under tp a checkpointed block's moves repeat in backward.
  TrainConfig checkpointed_tp = gpt_tp;
  checkpointed_tp.ac = tessera::nn::ActivationCheckpointPolicy::parse("every:2");
  cases.push_back({"GPT, (shard 3, tp 2), --ac every:2", checkpointed_tp});
  TrainConfig checkpointed = llama;
  checkpointed.ac = tessera::nn::ActivationCheckpointPolicy::parse("full");
  cases.push_back({"Llama, 3 ranks, --ac full", checkpointed});
  TrainConfig selective_tp = llama_tp;
  selective_tp.ac = tessera::nn::ActivationCheckpointPolicy::parse("selective");
  cases.push_back({"Llama, (replicate 2, shard 2, tp 2), bf16, --ac selective", selective_tp});

  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::unique_ptr<tessera::nn::CausalLM> meta = tessera::train::plan_model(c.config, c.config.tp);
    const tessera::train::RunPlan run = tessera::train::plan_run(c.config, *meta, tessera::train::run_mesh(c.config));
    const fsdp::ShardingPlan& plan = run.sharding;
    const fsdp::StepCommVolume& comm = run.traffic.fsdp;
    tessera::train::init_distributed(c.config, [&](const tessera::train::Distributed& distributed) {
      tessera::train::Trainer trainer(c.config, tessera::train::build_data(c.config), distributed);
      const fsdp::StepCommVolume live = fsdp::expected_comm_per_step(trainer.model(), c.config.grad_accum);
      const fsdp::ShardingPlan live_plan = fsdp::plan_of(trainer.model());
      tessera::train::StepMetrics metrics;
      for (int step = 0; step < 2; ++step) metrics = trainer.train_step();
      // Everything the run logs as sent: the most any rank sent.
      CHECK(metrics.comm_bytes == run.traffic.total_sent());
      // Rank 0 (tp rank 0 under tensor parallelism): the largest pieces and
      // the most real rows, the plan's per-rank figures.
      if (distributed.rank() != 0) return;
      // What FSDP sent in the last step, by kind.
      const tessera::dist::CommStats fsdp_sent = tessera::fsdp::fsdp_module(trainer.model())->communication_stats();
      CHECK(fsdp_sent[tessera::dist::CollectiveKind::all_gather].bytes_sent == comm.all_gather_bytes_sent);
      CHECK(fsdp_sent[tessera::dist::CollectiveKind::reduce_scatter].bytes_sent == comm.reduce_scatter_bytes_sent);
      CHECK(fsdp_sent[tessera::dist::CollectiveKind::all_reduce].bytes_sent ==
            comm.all_reduce_bytes_sent + comm.partial_gradient_bytes_sent);
      CHECK(fsdp_sent[tessera::dist::CollectiveKind::all_reduce].calls ==
            comm.all_reduce_calls + comm.partial_gradient_calls);

      // The calls the plan makes are the ones the Trainer's model got.
      REQUIRE(live_plan.units.size() == plan.units.size());
      for (size_t index = 0; index < plan.units.size(); ++index) {
        CHECK(live_plan.units[index].fqn == plan.units[index].fqn);
        REQUIRE(live_plan.units[index].params.size() == plan.units[index].params.size());
        for (size_t param = 0; param < plan.units[index].params.size(); ++param) {
          CAPTURE(plan.units[index].params[param].fqn);
          CHECK(live_plan.units[index].params[param].global_shape == plan.units[index].params[param].global_shape);
          CHECK(live_plan.units[index].params[param].tensor_parallel ==
                plan.units[index].params[param].tensor_parallel);
        }
        CHECK(live_plan.units[index].reshard_after_forward == plan.units[index].reshard_after_forward);
        CHECK(live_plan.units[index].param_dtype == plan.units[index].param_dtype);
      }
      CHECK(live.total_sent() == comm.total_sent());
      CHECK(live.all_gather_calls == comm.all_gather_calls);
      CHECK(live.all_reduce_bytes_sent == comm.all_reduce_bytes_sent);
      CHECK(live.partial_gradient_bytes_sent == comm.partial_gradient_bytes_sent);
      // Memory: padded shards, rank 0's gradients and AdamW's m and v, and
      // the unsharded peak of real steps (on tp rank 0's pieces).
      int64_t shards = 0, gradients = 0, adam = 0;
      for (const auto& [name, parameter] : trainer.model().named_parameters()) {
        const int64_t size = static_cast<int64_t>(tessera::element_size(parameter->tensor().dtype()));
        const tessera::Shape& shard_shape = parameter->tensor().sizes();
        const int64_t row_numel =
            tessera::shape_numel(tessera::Shape(shard_shape.begin() + 1, shard_shape.end()));
        shards += parameter->sharding()->padded_rows * row_numel * size;
        gradients += parameter->tensor().grad().numel() * size;
        const auto& state = trainer.optimizer().state(name);
        adam += (state.at("exp_avg").numel() + state.at("exp_avg_sq").numel()) * size;
      }
      CHECK(shards == plan.shard_bytes);
      CHECK(gradients == plan.gradient_bytes);
      CHECK(adam == tessera::train::kAdamWState.copies * plan.gradient_bytes);
      CHECK(tessera::fsdp::fsdp_module(trainer.model())->unsharded_memory().peak_bytes == plan.peak.bytes);
    });
  }
}

TEST_CASE("train --plan prints GPT-2 XL and Llama 3 8B over 1,024 ranks in full, starting no rank") {
  struct Case {
    tessera::train::ModelFamily family;
    const char* preset;
    const char* header;
    const char* totals;
  };
  for (const Case& c :
       {Case{tessera::train::ModelFamily::gpt, "gpt2-1558m", "FSDP sharding plan of GPT over 1024 ranks, mesh (shard=1024)",
             "  parameters            1557686400 (1557.686 M) in 580 tensors, 49 FSDP modules\n"},
        Case{tessera::train::ModelFamily::llama, "llama3-8b", "FSDP sharding plan of Llama over 1024 ranks, mesh (shard=1024)",
             "  parameters            8030261248 (8030.261 M) in 291 tensors, 33 FSDP modules\n"}}) {
    const std::string preset = c.preset;
    CAPTURE(preset);
    const TrainConfig config = preset_run(c.family, preset, 1024);
    std::ostringstream out;
    const auto start = std::chrono::steady_clock::now();
    tessera::train::train(config, out);  // 1024 local ranks would be refused: the plan starts none
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MESSAGE(preset << " over 1024 ranks planned in " << seconds << " s");
    const std::string plan = out.str();
    CHECK(plan.find(c.header) != std::string::npos);
    CHECK(plan.find(c.totals) != std::string::npos);
    CHECK(plan.find("  unsharded peak        ") != std::string::npos);
    CHECK(plan.find("the copy-out of (root) in forward") != std::string::npos);
    // Every parameter has its row: ceil(rows / 1024) rows on every rank.
    const std::unique_ptr<tessera::nn::CausalLM> model = tessera::train::build_model(config.model_config(), tessera::kMeta);
    for (const auto& [name, parameter] : model->named_parameters()) {
      const tessera::Shape& shape = parameter->global_shape();
      const int64_t rows = ceil_div(shape[0], 1024);
      const std::string row = table_row(plan, name);
      CAPTURE(row);
      CHECK(row.find(fmt::format("] {} {} ", rows, rows * 1024 - shape[0])) != std::string::npos);
    }
  }
  // Llama 3 8B on 8 ranks: every row count divides, so the shards are an eighth of the model.
  std::ostringstream out;
  tessera::train::print_plan(preset_run(tessera::train::ModelFamily::llama, "llama3-8b", 8), out);
  const std::string plan = out.str();
  CHECK(plan.find("  parameter shards      4015130624 B (3.7 GiB); padding 0 B across the 8 shard ranks\n") !=
        std::string::npos);
  CHECK(plan.find("  AdamW state (m, v)    8030261248 B (7.5 GiB)\n") != std::string::npos);
  CHECK(plan.find("not in the plan (estimate_rank_memory, --batch 1 x --seq-len 1024): about") != std::string::npos);

  // Llama 3 8B with tp 8 inside 1,024 ranks: every parameter's placement and
  // tp rank 0's piece, FSDP's rows of it over 128 ranks.
  TrainConfig tp8 = preset_run(tessera::train::ModelFamily::llama, "llama3-8b", 1024);
  tp8.tp = 8;
  std::ostringstream tp_out;
  const auto start = std::chrono::steady_clock::now();
  tessera::train::train(tp8, tp_out);
  MESSAGE("llama3-8b over (shard=128, tp=8) planned in "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s");
  const std::string tp_plan = tp_out.str();
  CHECK(tp_plan.find("FSDP sharding plan of Llama over 1024 ranks, mesh (shard=128, tp=8)") != std::string::npos);
  CHECK(tp_plan.find("mesh (shard=128, tp=8) over 1024 ranks: tp innermost") != std::string::npos);
  // Column-wise wq: 4096 / 8 rows; row-wise wo: 4096 / 8 columns; norms whole; the vocabulary 128256 / 8.
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"layers.0.attention.wq.weight", "[4096, 4096] Shard(0) [512, 4096] 4 0"},
      {"layers.0.attention.wk.weight", "[1024, 4096] Shard(0) [128, 4096] 1 0"},
      {"layers.0.attention.wo.weight", "[4096, 4096] Shard(1) [4096, 512] 32 0"},
      {"layers.0.feed_forward.w2.weight", "[4096, 14336] Shard(1) [4096, 1792] 32 0"},
      {"layers.0.attention_norm.weight", "[4096] Replicate, partial gradients [4096] 32 0"},
      {"tok_embeddings.weight", "[128256, 4096] Shard(0) [16032, 4096] 126 96"},
  };
  for (const auto& [name, cells] : rows) {
    const std::string row = table_row(tp_plan, name);  // its columns one space apart
    CAPTURE(row);
    CHECK(row.find(name + " " + cells + " ") == 0);
  }
  CHECK(tp_plan.find("TP activations' all-gather (tp group)") != std::string::npos);
  CHECK(tp_plan.find("partial gradients' all-reduce (tp group)") != std::string::npos);
  CHECK(tp_plan.find("total (the run's sent per rank)") != std::string::npos);
}

TEST_CASE("train --plan --sweep: the table, JSON, CSV and SVG carry each mesh's plan") {
  TempDir dir;
  TrainConfig config = small_run();
  config.plan = true;
  config.sweep = true;
  config.sweep_out = dir / "sweep.json";
  config.sweep_svg = dir / "sweep.svg";
  std::ostringstream out;
  tessera::train::train(config, out);
  const std::string text = out.str();
  CHECK(text.find("sweep: per-rank memory and bytes per step of tiny over 1 to 1024 ranks") != std::string::npos);

  const nlohmann::json sweep = nlohmann::json::parse(read_file(config.sweep_out));
  const auto& points = sweep.at("points");
  // tp 1: FSDP 1..1024, HSDP 2 x 1..512 and 8 x 1..128; tp 2: each up to
  // 1024 ranks in all; tp 4 and 8 do not divide the tiny GPT's 2 heads.
  REQUIRE(points.size() == (11 + 10 + 8) + (10 + 9 + 7));
  CHECK(text.find("skipped tp 4: ") != std::string::npos);
  CHECK(text.find("n_head") != std::string::npos);
  CHECK(sweep.at("model").at("parameters") == tessera::train::num_parameters(config.model_config()));
  const std::unique_ptr<tessera::nn::CausalLM> whole = tessera::train::plan_model(config, 1);
  const std::unique_ptr<tessera::nn::CausalLM> pieces = tessera::train::plan_model(config, 2);
  int64_t tensor_parallel_points = 0;
  for (const auto& point : points) {
    const fsdp::PlanMesh mesh = fsdp::plan_mesh(point.at("ranks"), point.at("replicate"), point.at("tp"));
    CAPTURE(mesh.to_string());
    CHECK(point.at("shard") == mesh.shard);
    const tessera::train::RunPlan run =
        tessera::train::plan_run(config, mesh.tensor_parallel == 1 ? *whole : *pieces, mesh);
    const fsdp::ShardingPlan& plan = run.sharding;
    CHECK(point.at("parameter_shard_bytes") == plan.shard_bytes);
    CHECK(point.at("gradient_shard_bytes") == plan.gradient_bytes);
    CHECK(point.at("optimizer_state_bytes") == 2 * plan.gradient_bytes);
    CHECK(point.at("peak_unsharded_bytes") == plan.peak.bytes);
    CHECK(point.at("peak_moment") == plan.peak.moment);
    CHECK(point.at("memory_bytes") == plan.shard_bytes + 3 * plan.gradient_bytes + plan.peak.bytes);
    CHECK(point.at("bytes_sent") == run.traffic.total_sent());
    CHECK(point.at("tensor_parallel_bytes_sent") == run.traffic.tensor_parallel.total().bytes_sent);
    CHECK((point.at("tensor_parallel_bytes_sent") > 0) == (mesh.tensor_parallel > 1));
    tensor_parallel_points += mesh.tensor_parallel > 1 ? 1 : 0;
    // The table has the point's row.
    CHECK(text.find(fmt::format("{} {:>6} ", mesh.to_string(), mesh.world())) != std::string::npos);
  }
  CHECK(tensor_parallel_points == 10 + 9 + 7);
  const std::string svg = read_file(config.sweep_svg);
  CHECK(svg.rfind("<svg", 0) == 0);
  for (const char* label :
       {"memory FSDP", "sent FSDP", "memory HSDP R=2", "sent HSDP R=8", "memory FSDP x TP 2", "sent HSDP R=2 x TP 2"}) {
    CHECK(svg.find(label) != std::string::npos);
  }

  // Earlier outputs are kept unless --overwrite; one file for both is refused.
  const std::string refusal = "--sweep-out " + config.sweep_out + " already exists";
  CHECK_THROWS_WITH_AS(tessera::train::train(config, out), doctest::Contains(refusal.c_str()), tessera::train::UsageError);
  config.overwrite = true;
  config.sweep_out = dir / "sweep.csv";
  config.nproc = 4;  // the run's own mesh must take N = 4 too
  config.reshard_after_forward = fsdp::ReshardAfterForward::to_group_of(4);
  std::ostringstream again;
  tessera::train::train(config, again);
  CHECK(again.str().find("skipped FSDP (shard=2): --reshard-after-forward 4 must divide its shard group of 2") !=
        std::string::npos);
  std::istringstream csv(read_file(config.sweep_out));
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(csv, line)) lines.push_back(line);
  // header; S = 4..1024, 4..512, 4..128 (S = 1, 2 skipped); no tp (a group size is refused with it)
  REQUIRE(lines.size() == 1 + 9 + 8 + 6);
  CHECK(again.str().find("skipped tp 2: --reshard-after-forward 4: a group size is refused with tensor parallelism") !=
        std::string::npos);
  CHECK(lines.front().rfind("series,ranks,replicate,shard,tp,parameter_shard_bytes,", 0) == 0);
  CHECK(lines[1].rfind("FSDP,4,1,4,1,", 0) == 0);
  config.sweep_svg = config.sweep_out;
  CHECK_THROWS_WITH_AS(tessera::train::train(config, again), doctest::Contains("--sweep-svg"), tessera::train::UsageError);
}
