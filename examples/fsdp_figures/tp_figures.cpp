// tp_figures: the pictures of docs/tp_step_by_step.md, drawn from a real
// run. A small GPT trains with tensor parallelism inside FSDP on (dp, tp)
// local ranks and on one rank; one step is traced and measured. Writes
// into --out:
//   NAME_timeline.svg  NAME_bytes.svg  NAME_memory.svg  NAME_loss.svg
//   NAME.json (every plotted number and the raw figures it comes from)
// tools/figures.sh runs it for the doc; tests/examples/check_tp_figures.py
// checks its output against its own logs and the parameters' shapes.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "examples/fsdp_figures/step_figures.h"
#include "examples/fsdp_figures/tp_step_run.h"
#include "tensor/error.h"
#include "train/svg_chart.h"

namespace {

namespace dist = tessera::dist;
using fsdp_figures::TensorParallelRun;
using nlohmann::json;

constexpr int kUsageExitCode = 2;  // as the other example programs
constexpr double kKiB = 1024.0;

std::string rank_words(const fsdp_figures::TensorParallelRank& rank, int index) {
  return fmt::format("rank {} (dp {}, tp {})", index, rank.dp, rank.tp);
}

int64_t sent(const dist::CommStats& stats, dist::CollectiveKind kind) { return stats[kind].bytes_sent; }

// What each rank sent in the traced step, by what it was for: the tp
// group's activation moves and the loss, FSDP's sums of partial gradients
// over tp, FSDP's gathers and reductions over dp.
charts::StackedBarChart bytes_chart(const TensorParallelRun& run) {
  using dist::CollectiveKind;
  charts::StackedBarChart chart{.title = fmt::format("KiB each rank sent in step {}, by purpose and group",
                                                     run.options.traced_step),
                                .y_label = "KiB sent",
                                .categories = {},
                                .layers = {{"TP all-gather of activations (tp)", {}},
                                           {"TP reduce-scatter of activations (tp)", {}},
                                           {"loss all-reduces (tp)", {}},
                                           {"partial gradients' all-reduce (tp, by FSDP)", {}},
                                           {"FSDP all-gather (dp)", {}},
                                           {"FSDP reduce-scatter (dp)", {}}}};
  for (size_t index = 0; index < run.ranks.size(); ++index) {
    const fsdp_figures::TensorParallelRank& rank = run.ranks[index];
    chart.categories.push_back(rank_words(rank, static_cast<int>(index)));
    const dist::CommStats& tp = rank.groups.at("tp");
    const dist::CommStats& dp = rank.groups.at("dp");
    const int64_t partial = sent(rank.fsdp_over_tp, CollectiveKind::all_reduce);
    const std::vector<int64_t> bytes = {sent(tp, CollectiveKind::all_gather),
                                        sent(tp, CollectiveKind::reduce_scatter),
                                        sent(tp, CollectiveKind::all_reduce) - partial,
                                        partial,
                                        sent(dp, CollectiveKind::all_gather),
                                        sent(dp, CollectiveKind::reduce_scatter)};
    for (size_t layer = 0; layer < bytes.size(); ++layer) {
      chart.layers[layer].values.push_back(static_cast<double>(bytes[layer]) / kKiB);
    }
  }
  return chart;
}

// Every rank's memory at each stage of the traced step, by what holds it.
charts::StackedBarChart memory_chart(const TensorParallelRun& run) {
  charts::StackedBarChart chart{.title = fmt::format("Each rank's memory in step {} (KiB), by what holds it",
                                                     run.options.traced_step),
                                .y_label = "KiB",
                                .categories = {},
                                .layers = {{"parameter shards", {}},
                                           {"optimizer state", {}},
                                           {"gradients", {}},
                                           {"gathered parameters", {}},
                                           {"activations and buffers", {}}}};
  for (size_t index = 0; index < run.ranks.size(); ++index) {
    for (const fsdp_figures::MemoryReading& reading : run.ranks[index].memory) {
      chart.categories.push_back(fmt::format("rank {} {}", index, reading.stage));
      const std::vector<int64_t> bytes = {reading.shards, reading.optimizer, reading.gradients, reading.unsharded,
                                          reading.activations_and_buffers()};
      for (size_t layer = 0; layer < bytes.size(); ++layer) {
        chart.layers[layer].values.push_back(static_cast<double>(bytes[layer]) / kKiB);
      }
    }
  }
  return chart;
}

charts::LineChart loss_chart(const TensorParallelRun& run) {
  charts::LineChart chart{.title = "Training loss: tensor parallelism inside FSDP, and one rank",
                          .x_label = "step",
                          .y_label = "loss",
                          .series = {}};
  auto series = [](std::string label, const std::vector<double>& losses, bool dashed) {
    charts::Series line{.label = std::move(label), .x = {}, .y = losses, .dashed = dashed, .markers = false};
    for (size_t step = 0; step < losses.size(); ++step) line.x.push_back(static_cast<double>(step + 1));
    return line;
  };
  chart.series.push_back(series(fmt::format("dp {} x tp {}", run.options.dp, run.options.tp), run.losses, false));
  chart.series.push_back(series("one rank", run.one_rank, true));
  return chart;
}

json run_json(const TensorParallelRun& run, const std::string& command) {
  const auto& options = run.options;
  json parameters = json::array();
  for (const auto& parameter : run.parameters) {
    parameters.push_back({{"name", parameter.name},
                          {"unit", parameter.unit},
                          {"logical", parameter.logical},
                          {"placement", parameter.placement},
                          {"sections", parameter.sections},
                          {"partial_gradient", parameter.partial_gradient},
                          {"pieces", parameter.pieces}});
  }
  json ranks = json::array();
  for (const auto& rank : run.ranks) {
    json memory = json::array();
    for (const auto& reading : rank.memory) memory.push_back(fsdp_figures::memory_json(reading));
    json groups = json::object();
    for (const auto& [name, stats] : rank.groups) groups[name] = fsdp_figures::comm_json(stats);
    ranks.push_back({{"dp", rank.dp},
                     {"tp", rank.tp},
                     {"peak_bytes", rank.peak},
                     {"memory_bytes", memory},
                     {"group_comm", groups},
                     {"fsdp_comm", fsdp_figures::comm_json(rank.fsdp)},
                     {"fsdp_comm_over_tp", fsdp_figures::comm_json(rank.fsdp_over_tp)}});
  }
  const auto& model = options.run.model;
  return {{"command", command},
          {"options",
           {{"dp", options.dp},
            {"tp", options.tp},
            {"steps", options.steps},
            {"traced_step", options.traced_step},
            {"batch", options.run.batch},
            {"seq_len", options.run.seq_len},
            {"lr", options.run.lr},
            {"seed", options.run.seed},
            {"dtype", "f32"},
            {"hardware_threads", std::max(1u, std::thread::hardware_concurrency())},
            {"model",
             {{"vocab_size", model.vocab_size},
              {"padded_vocab_size", model.padded_vocab_size()},
              {"block_size", model.block_size},
              {"n_layer", model.n_layer},
              {"n_head", model.n_head},
              {"n_embd", model.n_embd},
              {"bias", model.bias},
              {"parameters", model.num_parameters()}}}}},
          {"parameters", parameters},
          {"losses", run.losses},
          {"one_rank_losses", run.one_rank},
          {"loss_max_abs_difference_from_one_rank", fsdp_figures::max_difference(run.losses, run.one_rank)},
          {"trace_origin_us", fsdp_figures::origin_us(run.events)},
          {"event_columns", fsdp_figures::kEventColumns},
          {"events", fsdp_figures::events_json(run.events)},
          {"time_per_rank", fsdp_figures::time_per_rank(run.events, options.ranks())},
          {"ranks", ranks}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains a small GPT with tensor parallelism inside FSDP on local ranks and draws one step",
               "tp_figures"};
  fsdp_figures::TensorParallelOptions options;
  std::string out = "docs/figures", name = "tp_step";
  app.add_option("--out", out, "Directory for the pictures and the data file (created if missing)")
      ->check([](const std::string& text) { return text.empty() ? "must not be empty" : ""; });
  app.add_option("--name", name, "File names start with this")->check([](const std::string& text) {
    return text.empty() ? "must not be empty" : "";
  });
  app.add_option("--dp", options.dp, "Data-parallel ranks (FSDP shards each piece over them)")
      ->check(CLI::Range(1, 8));
  app.add_option("--tp", options.tp, "Tensor-parallel ranks (they split every layer; the model's 4 heads allow 2 or 4)")
      ->check(CLI::IsMember({2, 4}));
  app.add_option("--steps", options.steps, "Training steps")->check(CLI::Range(int64_t{1}, int64_t{10000}));
  app.add_option("--traced-step", options.traced_step, "The step (from 1) that is traced and measured")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int status = app.exit(error, std::cout, std::cerr);
    return status == 0 ? 0 : kUsageExitCode;
  }
  if (options.traced_step > options.steps) {
    std::cerr << fmt::format("tp_figures: error: --traced-step {} is past --steps {}\n", options.traced_step,
                             options.steps);
    return kUsageExitCode;
  }
  std::string command = "tp_figures";
  for (int index = 1; index < argc; ++index) command += std::string(" ") + argv[index];

  try {
    const TensorParallelRun run = fsdp_figures::run_tensor_parallel(options);
    const charts::Timeline timeline = fsdp_figures::timeline(
        run.events, options.ranks(),
        fmt::format("Step {} of tensor parallelism inside FSDP, (dp {}, tp {})", options.traced_step, options.dp,
                    options.tp));
    const charts::StackedBarChart bytes = bytes_chart(run);
    const charts::StackedBarChart memory = memory_chart(run);
    const charts::LineChart loss = loss_chart(run);
    const std::vector<std::string> files = {name + "_timeline.svg", name + "_bytes.svg", name + "_memory.svg",
                                            name + "_loss.svg"};
    const std::filesystem::path directory(out);
    std::filesystem::create_directories(directory);
    charts::write_svg((directory / files[0]).string(), charts::to_svg(timeline));
    charts::write_svg((directory / files[1]).string(), charts::to_svg(bytes));
    charts::write_svg((directory / files[2]).string(), charts::to_svg(memory));
    charts::write_svg((directory / files[3]).string(), charts::to_svg(loss));
    json data = run_json(run, command);
    data["figures"] = {{files[0], fsdp_figures::timeline_json(timeline, "the run")},
                       {files[1], fsdp_figures::bars_json(bytes)},
                       {files[2], fsdp_figures::bars_json(memory)},
                       {files[3], fsdp_figures::lines_json(loss)}};
    fsdp_figures::write_text(directory / (name + ".json"), fsdp_figures::readable_json(data) + "\n");
    std::cout << fmt::format(
        "tp_figures: loss {:.4f} -> {:.4f} over {} steps (one rank: {:.4f} -> {:.4f}); rank 0 peak {} in step {}; "
        "{} trace events; wrote {}/{}.json and 4 pictures\n",
        run.losses.front(), run.losses.back(), options.steps, run.one_rank.front(), run.one_rank.back(),
        dist::human_bytes(run.ranks.at(0).peak), options.traced_step, run.events.size(), out, name);
  } catch (const std::exception& error) {
    std::cerr << "tp_figures: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
