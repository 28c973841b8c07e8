// What the FSDP step pictures show, made from the runs' raw figures
// (step_runs.h): five charts (train/svg_chart.h) and one JSON
// document holding every plotted number next to the raw figures it comes
// from, so that a test can recompute each picture from the run's own logs.
#pragma once

#include <filesystem>
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

// ---- parts the tensor-parallel pictures (tp_figures.cpp) draw with too ----

// The step's first event, across ranks: time 0 of a timeline.
int64_t origin_us(const std::vector<tessera::dist::TraceEvent>& events);
// Lanes per rank (compute, FSDP, one per communication track), spans placed
// by place(), in ms from origin_us.
charts::Timeline timeline(const std::vector<tessera::dist::TraceEvent>& events, int ranks, std::string title);
// Per rank: the step's length and its compute, FSDP and communication time,
// and the communication hidden under compute.
nlohmann::json time_per_rank(const std::vector<tessera::dist::TraceEvent>& events, int ranks);
// Per collective kind called: calls, bytes sent and received.
nlohmann::json comm_json(const tessera::dist::CommStats& stats);
// One row per event, in recording order, with the columns of kEventColumns.
extern const std::vector<std::string> kEventColumns;
nlohmann::json events_json(const std::vector<tessera::dist::TraceEvent>& events);
// A memory reading: its layers, the activations' included.
nlohmann::json memory_json(const MemoryReading& reading);
// A chart's plotted values.
nlohmann::json bars_json(const charts::StackedBarChart& chart);
nlohmann::json lines_json(const charts::LineChart& chart);
// `events` names the run whose events the timeline's spans are.
nlohmann::json timeline_json(const charts::Timeline& chart, const char* events);
// JSON for people and diffs: a value on one line when its members are
// numbers, strings or flat lists and objects of those; deeper ones open one
// member per line.
std::string readable_json(const nlohmann::json& value, int depth = 0);
// `text` as the file `path`; throws tessera::Error when it cannot.
void write_text(const std::filesystem::path& path, const std::string& text);
// The largest |a[i] - b[i]| over the common length.
double max_difference(const std::vector<double>& a, const std::vector<double>& b);

// The data file: options, units, every run's raw figures (trace events with
// times from the step's first event, memory readings, comm stats, losses)
// and, under "figures", each chart's plotted values keyed by its file name.
// `files` names the pictures: naive timeline, timeline, memory, bytes, loss.
nlohmann::json to_json(const StepData& data, const Figures& figures, const std::vector<std::string>& files);

}  // namespace fsdp_figures
