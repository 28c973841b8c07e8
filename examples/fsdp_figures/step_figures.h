// What the FSDP step pictures show, made from the runs' raw figures
// (step_runs.h): five charts (train/svg_chart.h) and one JSON
// document holding every plotted number next to the raw figures it comes
// from, so that a test can recompute each picture from the run's own logs.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/fsdp_figures/step_runs.h"
#include "train/svg_chart.h"

namespace fsdp_figures {

// Everything one invocation measured.
struct StepData {
  RunOptions options{};
  std::string command{};  // the command line, as the doc quotes it
  std::vector<Unit> units{};
  ShardedRun fully_shard{};    // traced
  ShardedRun deterministic{};  // losses only: ProcessGroupOptions::deterministic
  ShardedRun naive{};          // traced
  std::vector<double> one_rank{};
};

struct Figures {
  charts::Timeline naive_timeline;  // NaiveFSDP's traced step
  charts::Timeline timeline;        // fully_shard's traced step
  charts::StackedBarChart memory;   // rank 0 at each stage of the step
  charts::StackedBarChart bytes;    // bytes rank 0 sent per unit in the step
  charts::LineChart loss;           // every run's loss per step
};

// Timelines draw a trace event in lane "rank R <lane>" as kind `kind`, or
// leave it out (empty kind): FSDP's per-module forward and backward spans
// nest around the rest and are in the JSON only.
struct EventPlacement {
  std::string lane, kind;
};
EventPlacement place(const tessera::dist::TraceEvent& event);

Figures make_figures(const StepData& data);

// The data file: options, units, every run's raw figures (trace events with
// times from the step's first event, memory readings, comm stats, losses)
// and, under "figures", each chart's plotted values keyed by its file name.
// `files` names the pictures: naive timeline, timeline, memory, bytes, loss.
nlohmann::json to_json(const StepData& data, const Figures& figures, const std::vector<std::string>& files);

}  // namespace fsdp_figures
