// The FSDP step pictures and their data file, from the runs' raw figures.
#include "examples/fsdp_figures/step_figures.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <thread>

#include "tensor/error.h"

namespace fsdp_figures {

namespace dist = tessera::dist;
using nlohmann::json;

namespace {

// Every timeline lists its kinds in this order, so both timelines colour them alike.
const std::vector<std::string> kTimelineKinds = {"forward",    "backward",  "optimizer", "all-gather", "reduce-scatter",
                                                 "all-reduce", "FSDP copy", "waiting for a collective"};

constexpr double kKiB = 1024.0;
constexpr double kMicrosecondsPerMs = 1000.0;

// The runs as the doc names them.
std::string mesh_words(const RunOptions& options) {
  if (options.replicate > 1) {
    return fmt::format("HSDP {}x{}", options.replicate, options.ranks / options.replicate);
  }
  return fmt::format("{} ranks", options.ranks);
}

}  // namespace

// The step's first event, across ranks: time 0 of a timeline.
int64_t origin_us(const std::vector<dist::TraceEvent>& events) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const dist::TraceEvent& event : events) origin = std::min(origin, event.start_us);
  return events.empty() ? 0 : origin;
}

namespace {

std::string span_label(const dist::TraceEvent& event) {
  std::string label = event.name;
  if (event.args.contains("module")) {
    const std::string module = event.args["module"].get<std::string>();
    label += " " + (module.empty() ? std::string("root") : module);
  }
  if (event.args.contains("bytes_sent")) {
    label += fmt::format(" #{}, {} B sent", event.args["sequence"].get<int64_t>(),
                         event.args["bytes_sent"].get<int64_t>());
  }
  return label;
}

std::string lane_label(int rank, const std::string& lane) { return fmt::format("rank {} {}", rank, lane); }

}  // namespace

charts::Timeline timeline(const std::vector<dist::TraceEvent>& events, int ranks, std::string title) {
  charts::Timeline chart{.title = std::move(title), .unit = "ms from the step's first event", .kinds = kTimelineKinds};
  const int64_t origin = origin_us(events);
  // Lanes per rank: compute, FSDP, then one per communication track (by name).
  std::set<std::string> comm_tracks;
  for (const dist::TraceEvent& event : events) {
    if (event.track.rfind("comm:", 0) == 0) comm_tracks.insert(event.track);
  }
  std::vector<std::string> lanes = {"compute", "FSDP"};
  lanes.insert(lanes.end(), comm_tracks.begin(), comm_tracks.end());
  for (int rank = 0; rank < ranks; ++rank) {
    for (const std::string& lane : lanes) chart.lanes.push_back({.label = lane_label(rank, lane), .spans = {}});
  }
  for (const dist::TraceEvent& event : events) {
    const EventPlacement placement = place(event);
    if (placement.kind.empty()) continue;
    const auto lane = std::find(lanes.begin(), lanes.end(), placement.lane) - lanes.begin();
    const int64_t start_us = event.start_us - origin;
    chart.lanes[static_cast<size_t>(event.rank) * lanes.size() + static_cast<size_t>(lane)].spans.push_back(
        {.start = static_cast<double>(start_us) / kMicrosecondsPerMs,
         .end = static_cast<double>(start_us + event.duration_us) / kMicrosecondsPerMs, .kind = placement.kind,
         .label = span_label(event)});
  }
  return chart;
}

namespace {

// Rank 0's readings as stacked KiB: what holds the bytes, bottom to top.
charts::StackedBarChart memory_chart(const StepData& data) {
  const RankStep& rank0 = data.fully_shard.ranks.at(0);
  charts::StackedBarChart chart{
      .title = fmt::format("Memory of rank 0 through step {} (reshard_after_forward={})", data.options.traced_step,
                           data.options.reshard_after_forward.to_string()),
      .y_label = "KiB live on rank 0",
      .categories = {},
      .layers = {{"parameter shards", {}},
                 {"optimizer state", {}},
                 {"gradients", {}},
                 {"unsharded parameters", {}},
                 {"activations and buffers", {}}}};
  for (const MemoryReading& reading : rank0.memory) {
    chart.categories.push_back(reading.stage);
    const int64_t values[] = {reading.shards, reading.optimizer, reading.gradients, reading.unsharded,
                              reading.activations_and_buffers()};
    for (size_t layer = 0; layer < chart.layers.size(); ++layer) {
      chart.layers[layer].values.push_back(static_cast<double>(values[layer]) / kKiB);
    }
  }
  return chart;
}

// The units in forward order: the root's all-gather comes first.
std::vector<std::string> units_in_forward_order(const std::vector<Unit>& units) {
  std::vector<std::string> order = {"root"};
  for (const Unit& unit : units) {
    if (unit.module != "root") order.push_back(unit.module);
  }
  return order;
}

charts::StackedBarChart bytes_chart(const StepData& data) {
  const RankStep& rank0 = data.fully_shard.ranks.at(0);
  const dist::CollectiveKind kinds[] = {dist::CollectiveKind::all_gather, dist::CollectiveKind::reduce_scatter,
                                        dist::CollectiveKind::all_reduce};
  const char* labels[] = {"all-gather", "reduce-scatter", "all-reduce (HSDP)"};
  charts::StackedBarChart chart{
      .title = fmt::format("KiB rank 0 sends in step {} ({}, reshard_after_forward={})", data.options.traced_step,
                           mesh_words(data.options), data.options.reshard_after_forward.to_string()),
      .y_label = "KiB sent by rank 0",
      .categories = {},
      .layers = {}};
  std::vector<std::vector<double>> values(3);
  auto add = [&](const std::string& category, const dist::CommStats& stats) {
    chart.categories.push_back(category);
    for (size_t kind = 0; kind < 3; ++kind) {
      values[kind].push_back(static_cast<double>(stats[kinds[kind]].bytes_sent) / kKiB);
    }
  };
  dist::CommStats total;
  for (const std::string& unit : units_in_forward_order(data.units)) {
    const dist::CommStats& stats = rank0.unit_comm.at(unit);
    add(unit, stats);
    for (const dist::CollectiveKind kind : kinds) total[kind].bytes_sent += stats[kind].bytes_sent;
  }
  add("all units", total);
  add("NaiveFSDP", data.naive.ranks.at(0).group_comm.begin()->second);
  for (size_t kind = 0; kind < 3; ++kind) {
    const bool any = std::any_of(values[kind].begin(), values[kind].end(), [](double value) { return value > 0; });
    if (any) chart.layers.push_back({labels[kind], values[kind]});
  }
  return chart;
}

charts::LineChart loss_chart(const StepData& data) {
  const RunOptions& options = data.options;
  // HSDP sums each gradient in another order (per replica first): rounding
  // differs, and AdamW carries it on.
  charts::LineChart chart{.title = fmt::format("Loss per step: one rank and {}, {}", mesh_words(options),
                                               options.replicate > 1 ? "the same up to rounding" : "bit for bit"),
                          .x_label = "step",
                          .y_label = "mean loss over the global batch",
                          .series = {}};
  std::vector<double> steps;
  for (size_t step = 1; step <= data.one_rank.size(); ++step) steps.push_back(static_cast<double>(step));
  chart.series.push_back({.label = fmt::format("1 rank, {} micro-batches", options.ranks), .x = steps,
                          .y = data.one_rank});
  chart.series.push_back({.label = fmt::format("fully_shard, {}", mesh_words(options)), .x = steps,
                          .y = data.fully_shard.losses, .dashed = true});
  chart.series.push_back({.label = "deterministic mode", .x = steps, .y = data.deterministic.losses,
                          .dashed = true});
  chart.series.push_back({.label = fmt::format("NaiveFSDP, {} ranks", options.ranks), .x = steps,
                          .y = data.naive.losses, .markers = true});
  return chart;
}

// ---- time per rank ----------------------------------------------------------------------------

// Disjoint, sorted [begin, end) intervals in microseconds.
using Intervals = std::vector<std::pair<int64_t, int64_t>>;

Intervals merged(Intervals intervals) {
  std::sort(intervals.begin(), intervals.end());
  Intervals out;
  for (const auto& [begin, end] : intervals) {
    if (!out.empty() && begin <= out.back().second) {
      out.back().second = std::max(out.back().second, end);
    } else {
      out.emplace_back(begin, end);
    }
  }
  return out;
}

int64_t length(const Intervals& intervals) {
  int64_t total = 0;
  for (const auto& [begin, end] : intervals) total += end - begin;
  return total;
}

Intervals intersection(const Intervals& a, const Intervals& b) {
  Intervals out;
  for (const auto& [a_begin, a_end] : a) {
    for (const auto& [b_begin, b_end] : b) {
      const int64_t begin = std::max(a_begin, b_begin), end = std::min(a_end, b_end);
      if (begin < end) out.emplace_back(begin, end);
    }
  }
  return merged(std::move(out));
}

Intervals difference(const Intervals& a, const Intervals& b) {
  Intervals out;
  for (const auto& [a_begin, a_end] : a) {
    int64_t begin = a_begin;
    for (const auto& [b_begin, b_end] : b) {  // b is sorted and disjoint
      if (b_end <= begin || b_begin >= a_end) continue;
      if (b_begin > begin) out.emplace_back(begin, b_begin);
      begin = std::max(begin, b_end);
    }
    if (begin < a_end) out.emplace_back(begin, a_end);
  }
  return merged(std::move(out));
}

}  // namespace

// Where each rank's time went in the traced step, from the drawn spans: its
// compute lane, its FSDP lane (copies and waits on the compute thread) and
// its communication lanes. Hidden: communication while the compute thread
// computes (in its compute lane, outside its FSDP lane).
json time_per_rank(const std::vector<dist::TraceEvent>& events, int ranks) {
  const int64_t origin = origin_us(events);
  json out = json::array();
  for (int rank = 0; rank < ranks; ++rank) {
    Intervals compute, fsdp, communication;
    int64_t last = 0;
    for (const dist::TraceEvent& event : events) {
      if (event.rank != rank) continue;
      const int64_t begin = event.start_us - origin, end = begin + event.duration_us;
      last = std::max(last, end);
      const EventPlacement placement = place(event);
      if (placement.kind.empty()) continue;
      if (placement.lane == "compute") {
        compute.emplace_back(begin, end);
      } else if (placement.lane == "FSDP") {
        fsdp.emplace_back(begin, end);
      } else {
        communication.emplace_back(begin, end);
      }
    }
    compute = merged(std::move(compute));
    fsdp = merged(std::move(fsdp));
    communication = merged(std::move(communication));
    out.push_back({{"rank", rank},
                   {"step_us", last},
                   {"compute_us", length(compute)},
                   {"fsdp_us", length(fsdp)},
                   {"communication_us", length(communication)},
                   {"hidden_us", length(intersection(communication, difference(compute, fsdp)))}});
  }
  return out;
}

// ---- JSON -------------------------------------------------------------------------------------

json comm_json(const dist::CommStats& stats) {
  json out = json::object();
  for (size_t kind = 0; kind < stats.by_kind.size(); ++kind) {
    const dist::CollectiveStats& entry = stats.by_kind[kind];
    if (entry.calls == 0) continue;
    out[std::string(dist::collective_name(static_cast<dist::CollectiveKind>(kind)))] = {
        {"calls", entry.calls}, {"bytes_sent", entry.bytes_sent}, {"bytes_received", entry.bytes_received}};
  }
  return out;
}

const std::vector<std::string> kEventColumns = {"rank", "track", "name", "start_us", "duration_us", "lane", "kind",
                                                "args"};

json events_json(const std::vector<dist::TraceEvent>& events) {
  const int64_t origin = origin_us(events);
  json rows = json::array();
  for (const dist::TraceEvent& event : events) {
    const EventPlacement placement = place(event);
    json args = json::object();
    for (const char* key : {"module", "sequence", "bytes_sent"}) {
      if (event.args.contains(key)) args[key] = event.args[key];
    }
    rows.push_back(json::array({event.rank, event.track, event.name, event.start_us - origin, event.duration_us,
                                placement.kind.empty() ? json(nullptr) : json(lane_label(event.rank, placement.lane)),
                                placement.kind.empty() ? json(nullptr) : json(placement.kind), args}));
  }
  return rows;
}

namespace {

json ranks_json(const std::vector<RankStep>& ranks) {
  json out = json::array();
  for (const RankStep& rank : ranks) {
    json entry = {{"peak_bytes", rank.peak}, {"shards_allocated_bytes", rank.shards_allocated}};
    json memory = json::array();
    for (const MemoryReading& reading : rank.memory) memory.push_back(memory_json(reading));
    if (!memory.empty()) entry["memory_bytes"] = memory;
    json units = json::object();
    for (const auto& [name, stats] : rank.unit_comm) units[name] = comm_json(stats);
    if (!units.empty()) entry["unit_comm"] = units;
    json groups = json::object();
    for (const auto& [name, stats] : rank.group_comm) groups[name] = comm_json(stats);
    entry["group_comm"] = groups;
    out.push_back(entry);
  }
  return out;
}

}  // namespace

json memory_json(const MemoryReading& reading) {
  json out = {{"stage", reading.stage},
              {"live", reading.live},
              {"shards", reading.shards},
              {"optimizer", reading.optimizer},
              {"gradients", reading.gradients},
              {"unsharded", reading.unsharded},
              {"activations_and_buffers", reading.activations_and_buffers()}};
  if (!reading.unsharded_by_unit.empty()) out["unsharded_by_unit"] = reading.unsharded_by_unit;
  return out;
}

json bars_json(const charts::StackedBarChart& chart) {
  json layers = json::array();
  for (const charts::BarLayer& layer : chart.layers) {
    layers.push_back({{"label", layer.label}, {"values", layer.values}});
  }
  return {{"title", chart.title}, {"y_label", chart.y_label}, {"categories", chart.categories}, {"layers", layers}};
}


json lines_json(const charts::LineChart& chart) {
  json series = json::array();
  for (const charts::Series& line : chart.series) {
    series.push_back({{"label", line.label}, {"x", line.x}, {"y", line.y}});
  }
  return {{"title", chart.title}, {"series", series}};
}


json timeline_json(const charts::Timeline& chart, const char* events) {
  json lanes = json::array();
  for (const charts::Lane& lane : chart.lanes) lanes.push_back(lane.label);
  return {{"title", chart.title},
          {"unit", chart.unit},
          {"lanes", lanes},
          {"kinds", chart.kinds},
          {"spans", fmt::format("the events of {} whose lane and kind are set, from start_us / 1000 to (start_us + "
                                "duration_us) / 1000",
                                events)}};
}


double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}


// JSON for people and diffs: a value goes on one line when each of its
// members is a number, a string or a list or object of those (an event, a
// memory reading, a loss curve); anything deeper opens one member per line.
namespace {

bool fits_one_line(const nlohmann::json& value) {
  if (!value.is_structured()) return true;
  for (const auto& member : value) {
    if (!member.is_structured()) continue;
    for (const auto& inner : member) {
      if (inner.is_structured()) return false;
    }
  }
  return true;
}

}  // namespace

std::string readable_json(const nlohmann::json& value, int depth) {
  if (fits_one_line(value)) return value.dump();
  const std::string indent(static_cast<size_t>(depth + 1), ' '), close(static_cast<size_t>(depth), ' ');
  std::string text = value.is_object() ? "{\n" : "[\n";
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!first) text += ",\n";
    first = false;
    text += indent;
    if (value.is_object()) text += nlohmann::json(it.key()).dump() + ": ";
    text += readable_json(*it, depth + 1);
  }
  return text + "\n" + close + (value.is_object() ? "}" : "]");
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TESSERA_CHECK(static_cast<bool>(out), "cannot open {} for writing", path.string());
  out << text;
  out.flush();
  TESSERA_CHECK(static_cast<bool>(out), "writing {} failed", path.string());
}

EventPlacement place(const dist::TraceEvent& event) {
  if (event.track == "compute") return {"compute", event.name};
  if (event.track == "fsdp") {
    if (event.name == "forward" || event.name == "backward") return {};
    if (event.name == "copy_in" || event.name == "copy_out" || event.name == "reduce_scatter_copy_in" ||
        event.name == "accumulate_grad") {
      return {"FSDP", "FSDP copy"};
    }
    // all_gather_wait, reduce_scatter_wait, replicate_all_reduce (HSDP's, blocking);
    // NaiveFSDP's gather and reduce_scatter_gradients (blocking collectives, one per parameter).
    return {"FSDP", "waiting for a collective"};
  }
  if (event.name == "all_gather_into") return {event.track, "all-gather"};
  if (event.name == "reduce_scatter_into") return {event.track, "reduce-scatter"};
  if (event.name == "all_reduce") return {event.track, "all-reduce"};
  return {event.track, event.name};
}

Figures make_figures(const StepData& data) {
  const RunOptions& options = data.options;
  return {.naive_timeline = timeline(data.naive.events, options.ranks,
                                     fmt::format("NaiveFSDP, step {} on {} ranks", options.traced_step, options.ranks)),
          .timeline = timeline(data.fully_shard.events, options.ranks,
                               fmt::format("fully_shard, step {} on {}{}", options.traced_step, mesh_words(options),
                                           options.prefetch ? "" : ", no prefetch")),
          .memory = memory_chart(data),
          .bytes = bytes_chart(data),
          .loss = loss_chart(data)};
}

json to_json(const StepData& data, const Figures& figures, const std::vector<std::string>& files) {
  const RunOptions& options = data.options;
  json units = json::array();
  for (const Unit& unit : data.units) {
    json parameters = json::array();
    for (const ParameterShape& parameter : unit.parameters) {
      parameters.push_back({{"name", parameter.name}, {"shape", parameter.shape}});
    }
    units.push_back({{"module", unit.module}, {"parameters", parameters}});
  }
  json out;
  out["command"] = data.command;
  out["options"] = {{"ranks", options.ranks},
                    {"replicate", options.replicate},
                    {"shard", options.ranks / options.replicate},
                    {"reshard_after_forward", options.reshard_after_forward.to_string()},
                    {"prefetch", options.prefetch},
                    {"steps", options.steps},
                    {"traced_step", options.traced_step},
                    {"batch", options.batch},
                    {"seq_len", options.seq_len},
                    {"lr", options.lr},
                    {"seed", options.seed},
                    {"dtype", "f32"},
                    {"hardware_threads", std::max(1u, std::thread::hardware_concurrency())},
                    {"model",
                     {{"vocab_size", options.model.vocab_size},
                      {"block_size", options.model.block_size},
                      {"n_layer", options.model.n_layer},
                      {"n_head", options.model.n_head},
                      {"n_embd", options.model.n_embd},
                      {"parameters", options.model.num_parameters()}}}};
  out["units"] = units;
  out["one_rank"] = {{"losses", data.one_rank}};
  out["fully_shard"] = {{"losses", data.fully_shard.losses},
                        {"trace_origin_us", origin_us(data.fully_shard.events)},
                        {"event_columns", kEventColumns},
                        {"events", events_json(data.fully_shard.events)},
                        {"time_per_rank", time_per_rank(data.fully_shard.events, options.ranks)},
                        {"ranks", ranks_json(data.fully_shard.ranks)}};
  out["fully_shard_deterministic"] = {{"losses", data.deterministic.losses}};
  out["naive"] = {{"losses", data.naive.losses},
                  {"trace_origin_us", origin_us(data.naive.events)},
                  {"event_columns", kEventColumns},
                  {"events", events_json(data.naive.events)},
                  {"time_per_rank", time_per_rank(data.naive.events, options.ranks)},
                  {"ranks", ranks_json(data.naive.ranks)}};
  out["loss_max_abs_difference_from_one_rank"] = {
      {"fully_shard", max_difference(data.one_rank, data.fully_shard.losses)},
      {"fully_shard_deterministic", max_difference(data.one_rank, data.deterministic.losses)},
      {"naive", max_difference(data.one_rank, data.naive.losses)}};
  out["figures"] = {{files.at(0), timeline_json(figures.naive_timeline, "naive")},
                    {files.at(1), timeline_json(figures.timeline, "fully_shard")},
                    {files.at(2), bars_json(figures.memory)},
                    {files.at(3), bars_json(figures.bytes)},
                    {files.at(4), lines_json(figures.loss)}};
  return out;
}

}  // namespace fsdp_figures
