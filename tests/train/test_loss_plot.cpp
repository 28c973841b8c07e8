// train --loss-plot: the picture holds the run's own figures (read back from
// its data-* attributes and held against --log-json), its last line names the
// file, and the file follows the rules of the run's other outputs.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/error.h"
#include "tests/checkpoint/temp_dir.h"
#include "tests/train/text_file.h"
#include "train/loss_plot.h"
#include "train/train_config.h"
#include "train/training_run.h"

using tessera::train::TrainConfig;
using tessera::checkpoint::testing::TempDir;

using tessera::testing::read_file;

namespace {

using Points = std::vector<std::pair<double, double>>;

// The points of the series labelled `label` ("x,y x,y ..." in data-points).
Points series_points(const std::string& svg, const std::string& label) {
  const std::regex pattern("data-label=\"" + label + "\" data-points=\"([^\"]*)\"");
  std::smatch match;
  REQUIRE(std::regex_search(svg, match, pattern));
  Points points;
  std::istringstream in(match[1].str());
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    points.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return points;
}

// A run of a few seconds: the tiny GPT on the default corpus, 2 ranks.
TrainConfig short_run(const TempDir& dir) {
  TrainConfig config;
  config.batch = 4;
  config.seq_len = 32;
  config.steps = 12;
  config.warmup = 2;
  config.eval_every = 5;
  config.eval_batches = 2;
  config.nproc = 2;
  config.log_json = dir / "steps.jsonl";
  config.loss_plot = dir / "loss.svg";
  return config;
}

}  // namespace

TEST_CASE("loss chart: train loss per step, validation at its steps, the unigram entropy as a flat line") {
  const tessera::train::LossHistory history{.first_step = 11, .losses = {5.5, 4.25, 3.125}, .val_losses = {{12, 4.5}, {13, 3.5}},
                                 .unigram_entropy = 3.3};
  const charts::LineChart chart = tessera::train::loss_chart(history, "title");
  REQUIRE(chart.series.size() == 3);
  CHECK(chart.series[0].label == "train loss");
  CHECK(chart.series[0].x == std::vector<double>{11, 12, 13});
  CHECK(chart.series[0].y == history.losses);
  CHECK(chart.series[1].label == "validation loss");
  CHECK(chart.series[1].markers);
  CHECK(chart.series[1].x == std::vector<double>{12, 13});
  CHECK(chart.series[1].y == std::vector<double>{4.5, 3.5});
  CHECK(chart.series[2].dashed);
  CHECK(chart.series[2].x == std::vector<double>{11, 13});
  CHECK(chart.series[2].y == std::vector<double>{3.3, 3.3});

  const tessera::train::LossHistory no_evaluation{.first_step = 1, .losses = {2.0, 1.0}, .val_losses = {}, .unigram_entropy = 3};
  CHECK(tessera::train::loss_chart(no_evaluation, "t").series.size() == 2);  // no validation series
}

TEST_CASE("train --loss-plot draws the run's losses, names the file last, and refuses to replace it") {
  TempDir dir;
  const TrainConfig config = short_run(dir);
  std::ostringstream out;
  const tessera::train::TrainSummary summary = tessera::train::train(config, out);
  INFO("log:\n" << out.str());
  REQUIRE(summary.losses.size() == 12);

  // The last line of the log names the picture.
  std::string last_line, line;
  std::istringstream lines(out.str());
  while (std::getline(lines, line)) last_line = line;
  CHECK(last_line.rfind("plot     " + config.loss_plot + " (loss of steps 1 to 12", 0) == 0);

  // Its train series is every step's loss, as --log-json wrote them.
  const std::string svg = read_file(config.loss_plot);
  const Points train = series_points(svg, "train loss");
  REQUIRE(train.size() == 12);
  std::ifstream log(config.log_json);
  size_t index = 0;
  Points val_from_log;
  while (std::getline(log, line)) {
    const nlohmann::json step = nlohmann::json::parse(line);
    REQUIRE(index < train.size());
    CHECK(train[index].first == step.at("step").get<double>());
    CHECK(train[index].second == doctest::Approx(step.at("loss").get<double>()).epsilon(1e-12));
    CHECK(train[index].second == summary.losses[index]);
    if (step.contains("val_loss")) val_from_log.emplace_back(step.at("step"), step.at("val_loss"));
    ++index;
  }
  CHECK(index == 12);
  // Validation at steps 5, 10 and the last.
  const Points val = series_points(svg, "validation loss");
  REQUIRE(val.size() == 3);
  REQUIRE(val_from_log.size() == 3);
  for (size_t i = 0; i < val.size(); ++i) {
    CHECK(val[i].first == val_from_log[i].first);
    CHECK(val[i].second == doctest::Approx(val_from_log[i].second).epsilon(1e-12));
  }
  CHECK(val[0].first == 5);
  CHECK(val[2].first == 12);
  const Points entropy = series_points(svg, "unigram entropy");
  CHECK(entropy == Points{{1, summary.unigram_entropy}, {12, summary.unigram_entropy}});

  // A second launch must not replace it silently; with --overwrite it may.
  TrainConfig again = config;
  again.log_json.clear();
  CHECK_THROWS_WITH_AS(tessera::train::settle_loss_plot(again), doctest::Contains("already exists"), tessera::Error);
  again.overwrite = true;
  CHECK(tessera::train::settle_loss_plot(again) == config.loss_plot);
}

TEST_CASE("--loss-plot is checked before the start like the run's other outputs") {
  TempDir dir;
  TrainConfig config = short_run(dir);
  CHECK(tessera::train::settle_loss_plot(config) == config.loss_plot);
  config.loss_plot = "";
  CHECK(tessera::train::settle_loss_plot(config).empty());

  config.loss_plot = config.log_json;
  CHECK_THROWS_WITH_AS(tessera::train::settle_loss_plot(config), doctest::Contains("--log-json"), tessera::Error);
  config.loss_plot = dir / "absent-dir/loss.svg";
  CHECK_THROWS_WITH_AS(tessera::train::settle_loss_plot(config), doctest::Contains("does not exist"), tessera::Error);
  config.loss_plot = "/dev/null";
  CHECK_THROWS_WITH_AS(tessera::train::settle_loss_plot(config), doctest::Contains("a device, FIFO or socket"), tessera::Error);

  // A --resume draws beside the plot of the launch it continues.
  config.loss_plot = dir / "loss.svg";
  std::ofstream(config.loss_plot) << "<svg/>";
  config.ckpt_dir = dir / "ckpt";
  config.resume = true;
  CHECK(tessera::train::settle_loss_plot(config) == dir / "loss.from-step-1.svg");

  // --plan trains nothing, so it draws nothing.
  TrainConfig plan;
  plan.plan = true;
  plan.loss_plot = dir / "plan.svg";
  CHECK_THROWS_WITH_AS(plan.validate(), doctest::Contains("--plan trains nothing"), tessera::Error);
}
