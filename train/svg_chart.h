// SVG charts drawn from a run's own figures: the first run's loss curve, the
// --plan sweep, the FSDP step pictures of docs/. SVG written directly rather
// than through a plotting library: no dependency beyond the build's, output
// byte-for-byte reproducible (diffable in git, checkable by tests), and every
// plotted value is also written as a `data-*` attribute, so a test can read
// back what a picture shows.
//
// Three kinds: a line chart (x, y series, optional log axes), stacked bars
// (one bar per category, one coloured layer per part) and a timeline (one lane
// per rank, spans of compute and collectives).
#pragma once

#include <string>
#include <vector>

namespace charts {

struct Series {
  std::string label{};
  std::vector<double> x{}, y{};  // same length; x increasing
  bool dashed = false;
  bool markers = false;  // a dot per point (sparse series such as validation loss)
};

struct LineChart {
  std::string title{}, x_label{}, y_label{};
  bool log_x = false, log_y = false;  // log axes need positive values
  std::vector<Series> series{};
};

struct BarLayer {
  std::string label{};
  std::vector<double> values{};  // one per category
};

struct StackedBarChart {
  std::string title{}, y_label{};
  std::vector<std::string> categories{};  // the bars, left to right
  std::vector<BarLayer> layers{};         // stacked bottom to top
};

struct Span {
  double start = 0, end = 0;  // in the timeline's unit, start <= end
  std::string kind{};         // colour key, e.g. "forward", "all_gather"
  std::string label{};        // shown on hover
};

struct Lane {
  std::string label{};  // e.g. "rank 0 compute"
  std::vector<Span> spans{};
};

struct Timeline {
  std::string title{}, unit{};  // unit names the axis, e.g. "ms"
  std::vector<Lane> lanes{};
  // Colours by position in this list, so that timelines listing the same
  // kinds colour them alike; unlisted kinds follow in order of appearance.
  // The legend names only the kinds that have spans, in colour order.
  std::vector<std::string> kinds{};
};

// Each throws tessera::Error naming what is wrong with the chart's data (no
// series, lengths that differ, a non-positive value on a log axis, a span that
// ends before it starts, a timeline kind listed twice, a non-finite value).
std::string to_svg(const LineChart& chart);
std::string to_svg(const StackedBarChart& chart);
std::string to_svg(const Timeline& chart);

// Writes `svg` to `path` through a temporary file renamed into place, so a
// reader never sees half a picture; throws tessera::Error when it cannot.
void write_svg(const std::string& path, const std::string& svg);

}  // namespace charts
