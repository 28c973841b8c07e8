// The loss chart, and its file settled before the run like --trace's.
#include "train/loss_plot.h"

#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/file_io.h"
#include "tensor/error.h"
#include "train/checkpoint_manager.h"
#include "train/corpus.h"
#include "train/file_roles.h"
#include "train/run_files.h"

namespace tessera::train {

namespace checkpoint = tessera::checkpoint;

namespace {

// The plot and its temporary file against the run's other files (run_files.h
// checks those among themselves).
void check_roles(const TrainConfig& config, const std::string& path) {
  FileRoles roles;
  roles.add_output(path == config.loss_plot ? "--loss-plot" : "--loss-plot (this launch's)", path);
  roles.add_output("--loss-plot's temporary file", partial_path(path));
  if (config.data.empty()) {
    for (const auto& file : default_corpus_files()) roles.add_input("--data (the default corpus)", file.string());
  } else if (config.data != kSyntheticData) {
    roles.add_input("--data", config.data);
  }
  if (!config.init_from.empty()) roles.add_input("--init-from", config.init_from);
  if (!config.ckpt_dir.empty()) roles.add_output_directory("--ckpt-dir", config.ckpt_dir, is_managed_entry);
  if (!config.log_json.empty()) roles.add_output("--log-json", config.log_json);
  if (!config.trace.empty()) roles.add_output("--trace", config.trace);
  if (!config.export_path.empty()) roles.add_output("--export", config.export_path);
  roles.add_output_stream("standard output", STDOUT_FILENO);
  roles.add_output_stream("standard error", STDERR_FILENO);
  roles.check();
}

}  // namespace

charts::LineChart loss_chart(const LossHistory& history, const std::string& title) {
  charts::LineChart chart{.title = title, .x_label = "step", .y_label = "loss (nats per token)"};
  charts::Series train{.label = "train loss"};
  for (size_t i = 0; i < history.losses.size(); ++i) {
    train.x.push_back(static_cast<double>(history.first_step + static_cast<int64_t>(i)));
    train.y.push_back(history.losses[i]);
  }
  chart.series.push_back(std::move(train));
  if (!history.val_losses.empty()) {
    charts::Series val{.label = "validation loss", .markers = true};
    for (const auto& [step, loss] : history.val_losses) {
      val.x.push_back(static_cast<double>(step));
      val.y.push_back(loss);
    }
    chart.series.push_back(std::move(val));
  }
  if (!history.losses.empty()) {
    const double first = static_cast<double>(history.first_step);
    const double last = first + static_cast<double>(history.losses.size() - 1);
    chart.series.push_back({.label = "unigram entropy",
                            .x = {first, last},
                            .y = {history.unigram_entropy, history.unigram_entropy},
                            .dashed = true});
  }
  return chart;
}

std::string settle_loss_plot(const TrainConfig& config) {
  if (config.loss_plot.empty()) return {};
  TESSERA_CHECK(!is_special_file(config.loss_plot),
                "--loss-plot {}: a device, FIFO or socket; the plot is written beside it and renamed over it, which "
                "would replace it: give the path of a regular file",
                config.loss_plot);
  std::string path = config.loss_plot;
  if (config.resume && !config.ckpt_dir.empty() && !config.overwrite && exists_no_follow(path)) {
    const std::vector<CheckpointEntry> existing = list_checkpoints(config.ckpt_dir);
    path = resumed_trace_path(path, (existing.empty() ? 0 : existing.back().step) + 1);
  }
  check_roles(config, path);
  if (!config.overwrite) {
    refuse_existing_output("--loss-plot", path,
                                       "pass --overwrite to replace it, or choose another path (a --resume draws "
                                       "beside it)");
  }
  try {
    checkpoint::check_can_create(path);
  } catch (const tessera::Error& failure) {
    tessera::fail("--loss-plot {}", failure.what());  // the error starts with the path
  }
  return path;
}

void write_loss_plot(const OutputClaim& plot, const LossHistory& history, const std::string& title) {
  plot.write(charts::to_svg(loss_chart(history, title)));
}

}  // namespace tessera::train
