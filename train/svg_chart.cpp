#include "train/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "tensor/error.h"

namespace charts {
namespace {

using tessera::fail;

// Okabe and Ito's palette: distinguishable with the common colour-vision
// deficiencies, and in greyscale print.
constexpr const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                    "#CC79A7", "#56B4E9", "#F0E442", "#000000"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

const char* colour(size_t index) { return kPalette[index % kPaletteSize]; }

// The plotting area inside a fixed canvas; the legend goes to its right.
struct Frame {
  double width = 760, height = 420;
  double left = 78, right = 190, top = 44, bottom = 56;
  double plot_width() const { return width - left - right; }
  double plot_height() const { return height - top - bottom; }
};

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Values in data-* attributes: enough digits to read a double back exactly.
std::string exact(double value) { return fmt::format("{:.17g}", value); }
// Coordinates: a hundredth of a pixel is finer than any screen.
std::string pixel(double value) { return fmt::format("{:.2f}", value); }
// Tick labels: short.
std::string tick_label(double value) { return fmt::format("{:.6g}", value); }

void check_finite(double value, const std::string& what) {
  if (!std::isfinite(value)) fail("svg chart: {} is {}, not a finite number", what, value);
}

// One axis: maps data values to pixels, linearly or by decades.
class Axis {
 public:
  Axis(double lowest, double highest, bool logarithmic, double pixel_begin, double pixel_end)
      : logarithmic_(logarithmic), pixel_begin_(pixel_begin), pixel_end_(pixel_end) {
    if (logarithmic_) {
      low_ = std::floor(std::log10(lowest));
      high_ = std::ceil(std::log10(highest));
      if (high_ == low_) high_ = low_ + 1;
    } else {
      if (lowest == highest) {  // one value: centre it in a range of its own size
        const double pad = lowest == 0 ? 1 : std::abs(lowest) * 0.5;
        lowest -= pad;
        highest += pad;
      }
      step_ = nice_step((highest - lowest) / 5);
      low_ = std::floor(lowest / step_) * step_;
      high_ = std::ceil(highest / step_) * step_;
    }
  }

  double to_pixel(double value) const {
    const double position = logarithmic_ ? std::log10(value) : value;
    return pixel_begin_ + (position - low_) / (high_ - low_) * (pixel_end_ - pixel_begin_);
  }

  std::vector<double> ticks() const {
    std::vector<double> values;
    if (logarithmic_) {
      // At most ~8 labelled decades: skip some when the range is wide.
      const int stride = std::max(1, static_cast<int>(std::ceil((high_ - low_) / 8)));
      for (double decade = low_; decade <= high_ + 1e-9; decade += stride) values.push_back(std::pow(10.0, decade));
    } else {
      const int count = static_cast<int>(std::llround((high_ - low_) / step_));
      for (int i = 0; i <= count; ++i) values.push_back(low_ + i * step_);
    }
    return values;
  }

 private:
  // 1, 2 or 5 times a power of ten, at least `rough`.
  static double nice_step(double rough) {
    const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
    for (const double multiple : {1.0, 2.0, 5.0, 10.0}) {
      if (multiple * magnitude >= rough) return multiple * magnitude;
    }
    return 10 * magnitude;
  }

  bool logarithmic_;
  double pixel_begin_, pixel_end_;
  double low_ = 0, high_ = 1, step_ = 1;
};

std::string header(const Frame& frame, const std::string& title) {
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      frame.width, frame.height);
  svg += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", frame.width, frame.height);
  svg += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", frame.left,
                     escape(title));
  return svg;
}

std::string legend_entry(const Frame& frame, size_t row, const std::string& label, const char* fill, bool line,
                         bool dashed = false) {
  const double x = frame.width - frame.right + 16;
  const double y = frame.top + 8 + 20 * static_cast<double>(row);
  std::string svg;
  if (line) {
    svg = fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", x, y,
                      x + 22, y, fill, dashed ? " stroke-dasharray=\"6 4\"" : "");
  } else {
    svg = fmt::format("<rect x=\"{}\" y=\"{}\" width=\"22\" height=\"12\" fill=\"{}\"/>\n", x, y - 6, fill);
  }
  return svg + fmt::format("<text x=\"{}\" y=\"{}\" dominant-baseline=\"middle\">{}</text>\n", x + 28, y,
                           escape(label));
}

// Grid lines and labels of a y axis over the plot's width.
std::string y_axis(const Frame& frame, const Axis& axis, const std::string& label) {
  std::string svg;
  for (const double tick : axis.ticks()) {
    const double y = axis.to_pixel(tick);
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#dddddd\"/>\n", frame.left, pixel(y),
                       frame.left + frame.plot_width(), pixel(y));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                       frame.left - 6, pixel(y), tick_label(tick));
  }
  svg += fmt::format("<text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                     pixel(frame.top + frame.plot_height() / 2), escape(label));
  return svg;
}

std::string x_axis(const Frame& frame, const Axis& axis, const std::string& label) {
  std::string svg;
  const double bottom = frame.top + frame.plot_height();
  for (const double tick : axis.ticks()) {
    const double x = axis.to_pixel(tick);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#dddddd\"/>\n", pixel(x),
                       frame.top, bottom);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", pixel(x), bottom + 16,
                       tick_label(tick));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     pixel(frame.left + frame.plot_width() / 2), frame.height - 12, escape(label));
  return svg;
}

std::string plot_border(const Frame& frame) {
  return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444444\"/>\n",
                     frame.left, frame.top, frame.plot_width(), frame.plot_height());
}

}  // namespace

std::string to_svg(const LineChart& chart) {
  if (chart.series.empty()) fail("svg chart '{}': a line chart needs at least one series", chart.title);
  double x_low = INFINITY, x_high = -INFINITY, y_low = INFINITY, y_high = -INFINITY;
  for (const Series& series : chart.series) {
    if (series.x.size() != series.y.size()) {
      fail("svg chart '{}': series '{}' has {} x values and {} y values", chart.title, series.label,
           series.x.size(), series.y.size());
    }
    if (series.x.empty()) fail("svg chart '{}': series '{}' has no points", chart.title, series.label);
    for (size_t i = 0; i < series.x.size(); ++i) {
      check_finite(series.x[i], fmt::format("x[{}] of series '{}'", i, series.label));
      check_finite(series.y[i], fmt::format("y[{}] of series '{}'", i, series.label));
      if (chart.log_x && series.x[i] <= 0) {
        fail("svg chart '{}': x[{}] = {} of series '{}' is not positive, on a log axis", chart.title, i,
             series.x[i], series.label);
      }
      if (chart.log_y && series.y[i] <= 0) {
        fail("svg chart '{}': y[{}] = {} of series '{}' is not positive, on a log axis", chart.title, i,
             series.y[i], series.label);
      }
      x_low = std::min(x_low, series.x[i]);
      x_high = std::max(x_high, series.x[i]);
      y_low = std::min(y_low, series.y[i]);
      y_high = std::max(y_high, series.y[i]);
    }
  }
  const Frame frame;
  const Axis x_axis_scale(x_low, x_high, chart.log_x, frame.left, frame.left + frame.plot_width());
  const Axis y_axis_scale(y_low, y_high, chart.log_y, frame.top + frame.plot_height(), frame.top);

  std::string svg = header(frame, chart.title);
  svg += y_axis(frame, y_axis_scale, chart.y_label);
  svg += x_axis(frame, x_axis_scale, chart.x_label);
  for (size_t index = 0; index < chart.series.size(); ++index) {
    const Series& series = chart.series[index];
    std::string points, data;
    for (size_t i = 0; i < series.x.size(); ++i) {
      if (i > 0) {
        points += ' ';
        data += ' ';
      }
      points += pixel(x_axis_scale.to_pixel(series.x[i])) + "," + pixel(y_axis_scale.to_pixel(series.y[i]));
      data += exact(series.x[i]) + "," + exact(series.y[i]);
    }
    svg += fmt::format(
        "<polyline class=\"series\" data-label=\"{}\" data-points=\"{}\" points=\"{}\" fill=\"none\" "
        "stroke=\"{}\" stroke-width=\"1.6\"{}/>\n",
        escape(series.label), data, points, colour(index), series.dashed ? " stroke-dasharray=\"6 4\"" : "");
    if (series.markers) {
      for (size_t i = 0; i < series.x.size(); ++i) {
        svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>\n",
                           pixel(x_axis_scale.to_pixel(series.x[i])), pixel(y_axis_scale.to_pixel(series.y[i])),
                           colour(index));
      }
    }
    svg += legend_entry(frame, index, series.label, colour(index), true, series.dashed);
  }
  return svg + plot_border(frame) + "</svg>\n";
}

std::string to_svg(const StackedBarChart& chart) {
  if (chart.categories.empty()) fail("svg chart '{}': a bar chart needs at least one category", chart.title);
  if (chart.layers.empty()) fail("svg chart '{}': a bar chart needs at least one layer", chart.title);
  std::vector<double> totals(chart.categories.size(), 0.0);
  for (const BarLayer& layer : chart.layers) {
    if (layer.values.size() != chart.categories.size()) {
      fail("svg chart '{}': layer '{}' has {} values for {} categories", chart.title, layer.label,
           layer.values.size(), chart.categories.size());
    }
    for (size_t i = 0; i < layer.values.size(); ++i) {
      check_finite(layer.values[i], fmt::format("value {} of layer '{}'", i, layer.label));
      if (layer.values[i] < 0) {
        fail("svg chart '{}': value {} of layer '{}' is {}; stacked bars need values >= 0", chart.title, i,
             layer.label, layer.values[i]);
      }
      totals[i] += layer.values[i];
    }
  }
  const Frame frame;
  const Axis y_scale(0, std::max(*std::max_element(totals.begin(), totals.end()), 1e-300), false,
                     frame.top + frame.plot_height(), frame.top);
  std::string svg = header(frame, chart.title);
  svg += y_axis(frame, y_scale, chart.y_label);

  const double slot = frame.plot_width() / static_cast<double>(chart.categories.size());
  const double bar_width = slot * 0.62;
  for (size_t category = 0; category < chart.categories.size(); ++category) {
    const double x = frame.left + slot * static_cast<double>(category) + (slot - bar_width) / 2;
    double stacked = 0;
    for (size_t index = 0; index < chart.layers.size(); ++index) {
      const double value = chart.layers[index].values[category];
      const double top = y_scale.to_pixel(stacked + value), bottom = y_scale.to_pixel(stacked);
      svg += fmt::format(
          "<rect class=\"bar\" data-category=\"{}\" data-layer=\"{}\" data-value=\"{}\" x=\"{}\" y=\"{}\" "
          "width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: {} {}</title></rect>\n",
          escape(chart.categories[category]), escape(chart.layers[index].label), exact(value), pixel(x),
          pixel(top), pixel(bar_width), pixel(bottom - top), colour(index), escape(chart.categories[category]),
          escape(chart.layers[index].label), tick_label(value));
      stacked += value;
    }
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", pixel(x + bar_width / 2),
                       frame.top + frame.plot_height() + 16, escape(chart.categories[category]));
  }
  for (size_t index = 0; index < chart.layers.size(); ++index) {
    svg += legend_entry(frame, index, chart.layers[index].label, colour(index), false);
  }
  return svg + plot_border(frame) + "</svg>\n";
}

std::string to_svg(const Timeline& chart) {
  if (chart.lanes.empty()) fail("svg chart '{}': a timeline needs at least one lane", chart.title);
  double begin = INFINITY, end = -INFINITY;
  std::map<std::string, size_t> kinds;  // colour of each kind: listed ones first, then by first appearance
  for (const std::string& kind : chart.kinds) {
    if (!kinds.emplace(kind, kinds.size()).second) fail("svg chart '{}': kind '{}' is listed twice", chart.title, kind);
  }
  std::map<size_t, std::string> present;  // the kinds that have spans, by colour
  for (const Lane& lane : chart.lanes) {
    for (const Span& span : lane.spans) {
      check_finite(span.start, fmt::format("a span's start in lane '{}'", lane.label));
      check_finite(span.end, fmt::format("a span's end in lane '{}'", lane.label));
      if (span.end < span.start) {
        fail("svg chart '{}': span '{}' in lane '{}' ends at {} before it starts at {}", chart.title, span.label,
             lane.label, span.end, span.start);
      }
      begin = std::min(begin, span.start);
      end = std::max(end, span.end);
      const size_t colour_index = kinds.emplace(span.kind, kinds.size()).first->second;
      present.emplace(colour_index, span.kind);
    }
  }
  if (present.empty()) fail("svg chart '{}': a timeline needs at least one span", chart.title);

  Frame frame;
  frame.left = 150;
  const double lane_height = 26;
  frame.height = frame.top + frame.bottom + lane_height * static_cast<double>(chart.lanes.size());
  frame.height = std::max(frame.height, frame.top + frame.bottom + 20.0 * static_cast<double>(present.size()));
  const Axis time_scale(begin, end, false, frame.left, frame.left + frame.plot_width());
  std::string svg = header(frame, chart.title);
  svg += x_axis(frame, time_scale, chart.unit);
  for (size_t row = 0; row < chart.lanes.size(); ++row) {
    const Lane& lane = chart.lanes[row];
    const double y = frame.top + lane_height * static_cast<double>(row);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                       frame.left - 8, pixel(y + lane_height / 2), escape(lane.label));
    for (const Span& span : lane.spans) {
      const double x0 = time_scale.to_pixel(span.start), x1 = time_scale.to_pixel(span.end);
      svg += fmt::format(
          "<rect class=\"span\" data-lane=\"{}\" data-kind=\"{}\" data-start=\"{}\" data-end=\"{}\" x=\"{}\" "
          "y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}</title></rect>\n",
          escape(lane.label), escape(span.kind), exact(span.start), exact(span.end), pixel(x0), pixel(y + 3),
          pixel(std::max(x1 - x0, 0.5)), pixel(lane_height - 6), colour(kinds.at(span.kind)),
          escape(span.label.empty() ? span.kind : span.label));
    }
  }
  size_t row = 0;
  for (const auto& [colour_index, kind] : present) svg += legend_entry(frame, row++, kind, colour(colour_index), false);
  return svg + plot_border(frame) + "</svg>\n";
}

void write_svg(const std::string& path, const std::string& svg) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail("svg chart: cannot open {} for writing", temporary);
    out << svg;
    out.flush();
    if (!out) fail("svg chart: writing {} failed", temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    fail("svg chart: cannot rename {} to {}", temporary, path);
  }
}

}  // namespace charts
