// fsdp_figures: the pictures of docs/fsdp_step_by_step.md, drawn from a real
// run. A small GPT trains on local ranks (threads) with NaiveFSDP, with
// fully_shard (and again in deterministic mode) and on one rank; one step of
// each sharded run is traced and measured. Writes into --out:
//   NAME_timeline_naive.svg  NAME_timeline.svg  NAME_memory.svg
//   NAME_bytes.svg           NAME_loss.svg      NAME.json (every plotted number and its raw figures)
// and with --perfetto the traced steps as Chrome/Perfetto traces (ui.perfetto.dev):
//   NAME_fully_shard.trace.json  NAME_naive.trace.json
// tools/figures.sh runs it for the doc; tests/examples/check_fsdp_figures.py
// checks its output against its own logs.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "dist/trace.h"
#include "examples/fsdp_figures/step_figures.h"
#include "examples/fsdp_figures/step_runs.h"
#include "tensor/error.h"
#include "train/svg_chart.h"

namespace {

using fsdp_figures::RunOptions;

constexpr int kUsageExitCode = 2;  // as the other example programs

std::optional<tessera::fsdp::ReshardAfterForward> parse_reshard(const std::string& text) {
  if (text == "true") return tessera::fsdp::ReshardAfterForward::always();
  if (text == "false") return tessera::fsdp::ReshardAfterForward::never();
  int64_t ranks = 0;
  try {
    size_t used = 0;
    ranks = std::stoll(text, &used);
    if (used != text.size()) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (ranks < 1) return std::nullopt;
  return tessera::fsdp::ReshardAfterForward::to_group_of(ranks);
}

// The events of one traced step, as dist::Tracer writes them for Perfetto.
void write_trace(const std::vector<tessera::dist::TraceEvent>& events, const std::filesystem::path& path) {
  tessera::dist::Tracer tracer;
  for (const tessera::dist::TraceEvent& event : events) tracer.record(event);
  tracer.write_chrome_trace(path.string());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains a small GPT with NaiveFSDP and fully_shard on local ranks and draws one step of each",
               "fsdp_figures"};
  RunOptions options;
  std::string out = "docs/figures", name = "fsdp_step", reshard_text = "true";
  bool no_prefetch = false, perfetto = false;
  app.add_option("--out", out, "Directory for the pictures and the data file (created if missing)")
      ->check([](const std::string& text) { return text.empty() ? "must not be empty" : ""; });
  app.add_option("--name", name, "File names start with this")->check([](const std::string& text) {
    return text.empty() ? "must not be empty" : "";
  });
  app.add_option("--ranks", options.ranks, "Local ranks (threads)")->check(CLI::Range(2, 64));
  app.add_option("--hsdp", options.replicate, "HSDP replicate degree R: a R x (ranks / R) (replicate, shard) mesh")
      ->check(CLI::Range(1, 64));
  app.add_option("--reshard-after-forward", reshard_text,
                 "The blocks free their gathered parameters after forward: true, false, or N (keep an N-rank "
                 "sharding for backward)")
      ->check(CLI::Validator(
          [](std::string& input) -> std::string {
            if (parse_reshard(input)) return {};
            return fmt::format("expected true, false or N >= 1, got '{}'", input);
          },
          "true|false|N"));
  app.add_flag("--no-prefetch", no_prefetch, "Empty prefetch lists: each unit all-gathers only when it runs");
  app.add_flag("--perfetto", perfetto, "Also write each traced step as a Chrome/Perfetto trace");
  app.add_option("--steps", options.steps, "Training steps of every run")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  app.add_option("--traced-step", options.traced_step, "The step (from 1) that is traced and measured")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int status = app.exit(error, std::cout, std::cerr);
    return status == 0 ? 0 : kUsageExitCode;
  }
  options.prefetch = !no_prefetch;
  options.reshard_after_forward = *parse_reshard(reshard_text);

  std::string command = "fsdp_figures";
  for (int index = 1; index < argc; ++index) command += std::string(" ") + argv[index];
  try {
    TESSERA_CHECK(options.ranks % options.replicate == 0, "--hsdp {} must divide --ranks {}", options.replicate,
                  options.ranks);
    TESSERA_CHECK(options.traced_step <= options.steps, "--traced-step {} is past --steps {}", options.traced_step,
                  options.steps);
    options.reshard_after_forward.shards_after_forward(options.ranks / options.replicate);  // throws unless N divides
  } catch (const tessera::Error& error) {
    std::cerr << "fsdp_figures: error: " << error.what() << "\n";
    return kUsageExitCode;
  }

  try {
    fsdp_figures::StepData data{.options = options, .command = command, .units = fsdp_figures::fsdp_units(options)};
    data.one_rank = fsdp_figures::run_one_rank(options);
    data.fully_shard = fsdp_figures::run_fully_shard(options, /*deterministic=*/false, /*trace=*/true);
    data.deterministic = fsdp_figures::run_fully_shard(options, /*deterministic=*/true, /*trace=*/false);
    data.naive = fsdp_figures::run_naive(options);

    const fsdp_figures::Figures figures = fsdp_figures::make_figures(data);
    const std::vector<std::string> files = {name + "_timeline_naive.svg", name + "_timeline.svg",
                                            name + "_memory.svg", name + "_bytes.svg", name + "_loss.svg"};
    const std::filesystem::path directory(out);
    std::filesystem::create_directories(directory);
    charts::write_svg((directory / files[0]).string(), charts::to_svg(figures.naive_timeline));
    charts::write_svg((directory / files[1]).string(), charts::to_svg(figures.timeline));
    charts::write_svg((directory / files[2]).string(), charts::to_svg(figures.memory));
    charts::write_svg((directory / files[3]).string(), charts::to_svg(figures.bytes));
    charts::write_svg((directory / files[4]).string(), charts::to_svg(figures.loss));
    if (perfetto) {
      write_trace(data.fully_shard.events, directory / (name + "_fully_shard.trace.json"));
      write_trace(data.naive.events, directory / (name + "_naive.trace.json"));
    }
    fsdp_figures::write_text(directory / (name + ".json"), fsdp_figures::readable_json(fsdp_figures::to_json(data, figures, files)) + "\n");

    const auto& rank0 = data.fully_shard.ranks.at(0);
    std::cout << fmt::format(
        "fsdp_figures: loss {:.4f} -> {:.4f} over {} steps; rank 0 peak {} (fully_shard) vs {} (NaiveFSDP) in step "
        "{}; {} trace events; wrote {}/{}.json and 5 pictures\n",
        data.one_rank.front(), data.one_rank.back(), options.steps, tessera::dist::human_bytes(rank0.peak),
        tessera::dist::human_bytes(data.naive.ranks.at(0).peak), options.traced_step, data.fully_shard.events.size(),
        out, name);
  } catch (const std::exception& error) {
    std::cerr << "fsdp_figures: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
