// train/svg_chart.h: what a picture shows is what it was given (read back from
// its data-* attributes), drawn where the axes say, and bad data is a
// tessera::Error naming what is wrong.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "train/svg_chart.h"

namespace {

// Every value of attribute `name` in the order the SVG has them.
std::vector<std::string> attributes(const std::string& svg, const std::string& name) {
  std::vector<std::string> values;
  const std::regex pattern(" " + name + "=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), pattern); it != std::sregex_iterator(); ++it) {
    values.push_back((*it)[1]);
  }
  return values;
}

// The text of every element of class `css_class` (one per line, as written).
std::vector<std::string> elements(const std::string& svg, const std::string& css_class) {
  std::vector<std::string> found;
  std::istringstream lines(svg);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find(" class=\"" + css_class + "\"") != std::string::npos) found.push_back(line);
  }
  return found;
}

std::vector<std::pair<double, double>> pairs(const std::string& text) {
  std::vector<std::pair<double, double>> points;
  std::istringstream in(text);
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    points.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return points;
}

}  // namespace

TEST_CASE("svg chart: a line chart carries its exact points, ordered on screen as in the data") {
  charts::LineChart chart{.title = "loss", .x_label = "step", .y_label = "loss"};
  chart.series.push_back({.label = "train", .x = {1, 2, 3, 4}, .y = {5.5, 3.25, 2.125, 0.1 + 0.2}});
  chart.series.push_back({.label = "val <held out>", .x = {2, 4}, .y = {3.5, 2.5}, .dashed = true, .markers = true});
  const std::string svg = charts::to_svg(chart);
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  const auto labels = attributes(svg, "data-label");
  REQUIRE(labels.size() == 2);
  CHECK(labels[0] == "train");
  CHECK(labels[1] == "val &lt;held out&gt;");  // escaped
  const auto data = attributes(svg, "data-points");
  const auto train = pairs(data[0]);
  REQUIRE(train.size() == 4);
  CHECK(train[3].second == 0.1 + 0.2);  // every digit survives
  // Screen positions: x grows to the right with step, y grows downward as loss falls.
  const auto screen = pairs(attributes(svg, "points")[0]);
  for (size_t i = 1; i < screen.size(); ++i) {
    CHECK(screen[i].first > screen[i - 1].first);
    CHECK(screen[i].second > screen[i - 1].second);
  }
  CHECK(attributes(svg, "cx").size() == 2);  // markers on the sparse series only
  CHECK(svg.find("stroke-dasharray") != std::string::npos);
  CHECK(charts::to_svg(chart) == svg);  // reproducible byte for byte
}

TEST_CASE("svg chart: log axes place decades evenly; a constant series still draws") {
  charts::LineChart chart{.title = "bytes per rank", .x_label = "ranks", .y_label = "bytes", .log_x = true,
                          .log_y = true};
  chart.series.push_back({.label = "shards", .x = {1, 10, 100, 1000}, .y = {1e9, 1e8, 1e7, 1e6}});
  const auto screen = pairs(attributes(charts::to_svg(chart), "points")[0]);
  REQUIRE(screen.size() == 4);
  const double step_x = screen[1].first - screen[0].first, step_y = screen[1].second - screen[0].second;
  for (size_t i = 2; i < screen.size(); ++i) {
    CHECK(screen[i].first - screen[i - 1].first == doctest::Approx(step_x).epsilon(1e-3));
    CHECK(screen[i].second - screen[i - 1].second == doctest::Approx(step_y).epsilon(1e-3));
  }
  charts::LineChart flat{.title = "flat"};
  flat.series.push_back({.label = "one value", .x = {0, 1}, .y = {2, 2}});
  CHECK(attributes(charts::to_svg(flat), "data-points")[0] == "0,2 1,2");
}

TEST_CASE("svg chart: stacked bars keep each layer's value and stack in order") {
  charts::StackedBarChart chart{.title = "memory", .y_label = "MiB", .categories = {"forward", "backward"}};
  chart.layers.push_back({.label = "shards", .values = {1, 1}});
  chart.layers.push_back({.label = "gathered", .values = {3, 0}});
  const std::string svg = charts::to_svg(chart);
  CHECK(attributes(svg, "data-value") == std::vector<std::string>{"1", "3", "1", "0"});
  CHECK(attributes(svg, "data-layer") == std::vector<std::string>{"shards", "gathered", "shards", "gathered"});
  // The second layer of the first bar sits on the first: its bottom edge is the first's top edge.
  const auto bars = elements(svg, "bar");
  REQUIRE(bars.size() == 4);
  CHECK(std::stod(attributes(bars[1], "y")[0]) + std::stod(attributes(bars[1], "height")[0]) ==
        doctest::Approx(std::stod(attributes(bars[0], "y")[0])).epsilon(1e-3));
  CHECK(std::stod(attributes(bars[1], "height")[0]) == doctest::Approx(3 * std::stod(attributes(bars[0], "height")[0])).epsilon(1e-2));
  CHECK(svg.find("data-category=\"backward\"") != std::string::npos);
}

TEST_CASE("svg chart: a timeline has a span per event, in its lane, coloured by kind") {
  charts::Timeline chart{.title = "step", .unit = "ms"};
  chart.lanes.push_back({.label = "rank 0", .spans = {{0, 2, "forward", "block 0"}, {2, 2.5, "all_gather", ""}}});
  chart.lanes.push_back({.label = "rank 1", .spans = {{0.5, 3, "forward", "block 0"}}});
  const std::string svg = charts::to_svg(chart);
  CHECK(attributes(svg, "data-lane") == std::vector<std::string>{"rank 0", "rank 0", "rank 1"});
  CHECK(attributes(svg, "data-kind") == std::vector<std::string>{"forward", "all_gather", "forward"});
  CHECK(attributes(svg, "data-start") == std::vector<std::string>{"0", "2", "0.5"});
  CHECK(attributes(svg, "data-end") == std::vector<std::string>{"2", "2.5", "3"});
  const auto spans = elements(svg, "span");
  REQUIRE(spans.size() == 3);
  CHECK(attributes(spans[0], "fill") == attributes(spans[2], "fill"));  // one colour per kind
  CHECK(attributes(spans[0], "fill") != attributes(spans[1], "fill"));
  CHECK(std::stod(attributes(spans[1], "x")[0]) > std::stod(attributes(spans[0], "x")[0]));
  CHECK(svg.find("<title>block 0</title>") != std::string::npos);
  CHECK(svg.find("<title>all_gather</title>") != std::string::npos);  // unlabelled spans show their kind
}

TEST_CASE("svg chart: timelines that list their kinds colour them alike and name only those they draw") {
  const std::vector<std::string> kinds{"forward", "backward", "all_gather", "wait"};
  charts::Timeline first{.title = "a", .unit = "us", .kinds = kinds};
  first.lanes.push_back({.label = "rank 0", .spans = {{0, 1, "all_gather", ""}, {1, 2, "forward", ""}}});
  charts::Timeline second{.title = "b", .unit = "us", .kinds = kinds};
  second.lanes.push_back(
      {.label = "rank 0", .spans = {{0, 1, "forward", ""}, {1, 2, "extra", ""}, {2, 3, "all_gather", ""}}});
  const std::string a = charts::to_svg(first), b = charts::to_svg(second);
  const auto a_spans = elements(a, "span"), b_spans = elements(b, "span");
  REQUIRE(a_spans.size() == 2);
  REQUIRE(b_spans.size() == 3);
  CHECK(attributes(a_spans[0], "fill") == attributes(b_spans[2], "fill"));  // all_gather, whatever came first
  CHECK(attributes(a_spans[1], "fill") == attributes(b_spans[0], "fill"));  // forward
  CHECK(attributes(b_spans[1], "fill") != attributes(b_spans[0], "fill"));  // an unlisted kind gets its own colour
  CHECK(attributes(b_spans[1], "fill") != attributes(b_spans[2], "fill"));
  // The legend: the drawn kinds, in the listed order, the unlisted one last; "backward" and "wait" are absent.
  const auto legend = [](const std::string& svg) {
    std::vector<std::string> names;
    const std::regex entry("dominant-baseline=\"middle\">([^<]*)</text>");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), entry); it != std::sregex_iterator(); ++it) {
      names.push_back((*it)[1]);
    }
    return names;
  };
  CHECK(legend(a) == std::vector<std::string>{"rank 0", "forward", "all_gather"});
  CHECK(legend(b) == std::vector<std::string>{"rank 0", "forward", "all_gather", "extra"});
  charts::Timeline twice{.title = "t", .kinds = {"forward", "forward"}};
  twice.lanes.push_back({.label = "rank 0", .spans = {{0, 1, "forward", ""}}});
  CHECK_THROWS_WITH_AS(charts::to_svg(twice), doctest::Contains("kind 'forward' is listed twice"), tessera::Error);
}

TEST_CASE("svg chart: bad data is a tessera::Error naming what is wrong") {
  charts::LineChart empty{.title = "t"};
  CHECK_THROWS_WITH_AS(charts::to_svg(empty), doctest::Contains("at least one series"), tessera::Error);
  charts::LineChart ragged{.title = "t"};
  ragged.series.push_back({.label = "s", .x = {1, 2}, .y = {1}});
  CHECK_THROWS_WITH_AS(charts::to_svg(ragged), doctest::Contains("2 x values and 1 y values"), tessera::Error);
  charts::LineChart log{.title = "t", .log_y = true};
  log.series.push_back({.label = "s", .x = {1, 2}, .y = {1, 0}});
  CHECK_THROWS_WITH_AS(charts::to_svg(log), doctest::Contains("not positive, on a log axis"), tessera::Error);
  charts::LineChart nan{.title = "t"};
  nan.series.push_back({.label = "s", .x = {1}, .y = {std::nan("")}});
  CHECK_THROWS_WITH_AS(charts::to_svg(nan), doctest::Contains("not a finite number"), tessera::Error);
  charts::StackedBarChart bars{.title = "b", .categories = {"a"}};
  bars.layers.push_back({.label = "l", .values = {1, 2}});
  CHECK_THROWS_WITH_AS(charts::to_svg(bars), doctest::Contains("2 values for 1 categories"), tessera::Error);
  bars.layers[0].values = {-1};
  CHECK_THROWS_WITH_AS(charts::to_svg(bars), doctest::Contains("values >= 0"), tessera::Error);
  charts::Timeline backwards{.title = "t"};
  backwards.lanes.push_back({.label = "rank 0", .spans = {{2, 1, "forward", "f"}}});
  CHECK_THROWS_WITH_AS(charts::to_svg(backwards), doctest::Contains("before it starts"), tessera::Error);
  CHECK_THROWS_WITH_AS(charts::write_svg("/nonexistent-dir/x.svg", "<svg/>"), doctest::Contains("cannot open"),
                       tessera::Error);
}

TEST_CASE("svg chart: write_svg replaces a file whole") {
  const std::string path = "test_svg_chart_output.svg";
  charts::write_svg(path, "<svg>old</svg>\n");
  charts::write_svg(path, "<svg>new</svg>\n");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == "<svg>new</svg>\n");
  std::remove(path.c_str());
}
