// The run: checks, banner, the step loop with checkpoints and evaluation, the stop, the export.
#include "train/training_run.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>

#include "checkpoint/rank_errors.h"
#include "checkpoint/safetensors_export.h"
#include "dist/launch/lifeline.h"
#include "dist/process_group.h"
#include "tensor/gemm_backend.h"
#include "tensor/parallel.h"
#include "train/checkpoint_manager.h"
#include "train/config_json.h"
#include "train/file_roles.h"
#include "train/flag_checks.h"
#include "train/graceful_stop.h"
#include "train/loss_plot.h"
#include "train/metrics.h"
#include "train/output_claim.h"
#include "train/resource_limits.h"
#include "train/run_files.h"
#include "train/run_identity.h"
#include "train/run_plan.h"
#include "train/run_record.h"
#include "train/step_log.h"
#include "train/trainer.h"

namespace tessera::train {

namespace checkpoint = tessera::checkpoint;
using Clock = std::chrono::steady_clock;

namespace {

void print_setup(const TrainConfig& config, const DataLoader& data, std::ostream& out) {
  out << describe(config) << '\n';
  out << fmt::format("data     {}\n         {} training and {} validation tokens\n", data.description(),
                     data.is_synthetic() ? std::string("unbounded") : std::to_string(data.train_tokens()),
                     data.is_synthetic() ? std::string("unbounded") : std::to_string(data.val_tokens()));
  if (!data.note().empty()) out << fmt::format("         {}\n", data.note());
  out << fmt::format("threads  {} per rank, vector ISA {}, GEMM {}\n", tessera::num_threads(),
                     tessera::cpu_instruction_set(), tessera::gemm_description());
  out << fmt::format("target   unigram entropy of the training data {:.4f} nats (a model that ignores context); "
                     "uniform guess ln({}) = {:.4f}\n",
                     data.unigram_entropy(), vocab_size(config.model_config()),
                     std::log(static_cast<double>(vocab_size(config.model_config()))));
}

// Throws on every rank the first error any rank reported ("" = none).
void agree_on_errors(const Distributed& distributed, const std::string& mine) {
  for (const nlohmann::json& report : checkpoint::gather_json(distributed.world, nlohmann::json(mine))) {
    TESSERA_CHECK(report.get<std::string>().empty(), "{}", report.get<std::string>());
  }
}

// Runs a check made before the start: what it refuses is a usage error
// (exit status 2), the command line as given cannot run.
template <typename Check>
auto before_start(const Check& check) -> decltype(check()) {
  try {
    return check();
  } catch (const UsageError&) {
    throw;
  } catch (const tessera::Error& error) {
    throw UsageError(error.what());
  }
}

// What rank 0 writes, claimed for the run once the root is (a launch the
// root refuses has touched none of it): the temporaries of the outputs
// written at the end (output_claim.h), then the log, locked and opened (a
// fresh run's emptied, a resumed run's cut after the checkpoint's step:
// step_log.h), last, so that a refused claim leaves the log as it was.
struct ClaimedOutputs {
  std::optional<OutputClaim> export_file;
  std::optional<OutputClaim> trace;
  std::optional<OutputClaim> loss_plot;
  std::optional<StepLog> log;
};

ClaimedOutputs claim_outputs(const TrainConfig& config, const RunFiles& files, const std::string& loss_plot,
                             const Distributed& distributed, const std::optional<CheckpointEntry>& resume_point) {
  ClaimedOutputs claimed;
  std::string error;
  if (distributed.rank() == 0) {
    const checkpoint::Publish publish = config.overwrite ? checkpoint::Publish::replace : checkpoint::Publish::no_clobber;
    try {
      if (!config.export_path.empty()) {
        claimed.export_file.emplace("--export", config.export_path, checkpoint::export_temporary_path(config.export_path),
                                    publish, config.export_format == "hf" ? FileLock::Kind::directory : FileLock::Kind::file);
      }
      if (!files.trace.empty() && !is_special_file(files.trace)) {  // a device is written to, not claimed
        claimed.trace.emplace("--trace", files.trace, partial_path(files.trace), publish);
      }
      if (!loss_plot.empty()) claimed.loss_plot.emplace("--loss-plot", loss_plot, partial_path(loss_plot), publish);
      if (!config.log_json.empty()) {
        try {
          claimed.log.emplace(config.resume ? StepLog::resume(config.log_json, resume_point ? resume_point->step : 0)
                                            : StepLog::create(config.log_json, config.overwrite));
        } catch (const tessera::Error& failure) {
          tessera::fail("--log-json {}", failure.what());
        }
      }
    } catch (const tessera::Error& failure) {
      error = failure.what();
    }
  }
  agree_on_errors(distributed, error);
  return claimed;
}

// The model family of the run recorded in a checkpoint root, when its
// run.json can be read; otherwise the manager's own message says what is wrong.
std::optional<ModelFamily> recorded_family(const std::string& root) {
  try {
    const RunRecord record =
        RunRecord::read((std::filesystem::path(root) / kRunRecordFile).string());
    return model_family_from_json(record.identity.at("model"), root);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The checkpoint root, claimed for this run: a fresh run needs one without
// checkpoints, --resume one of this run's identity (CheckpointManager says
// what it found; the flags to change are added here, and a resume of another
// model family is named as such).
std::unique_ptr<CheckpointManager> open_checkpoints(const TrainConfig& config, const DataLoader& data,
                                                                const Distributed& distributed) {
  if (config.ckpt_dir.empty()) return nullptr;
  ManagerOptions options{
      .group = distributed.world,
      .keep_last = config.keep,
      .sync = true,
      .mode = config.resume ? RootMode::continue_run : RootMode::new_run,
      .identity = run_identity(config, data),
      .may_change = {}};
  if (config.allow_data_change) options.may_change.push_back(kDataIdentityKey);
  try {
    return std::make_unique<CheckpointManager>(config.ckpt_dir, options);
  } catch (const tessera::Error& error) {
    const std::optional<ModelFamily> family = config.resume ? recorded_family(config.ckpt_dir) : std::nullopt;
    TESSERA_CHECK(!family || *family == config.family(),
                  "--ckpt-dir {}: the run saved there trains a {} model, this launch a {} (--model {}); resume it "
                  "with --model {} and the shape flags it was started with",
                  config.ckpt_dir, family_name(*family), family_name(config.family()), family_name(config.family()),
                  family_name(*family));
    tessera::fail("--ckpt-dir {}: {}\n{}", config.ckpt_dir, error.what(),
                  config.resume ? "A resume needs the run's model, --seed, data, --batch, --seq-len and global batch "
                                  "(--grad-accum x --nproc); --allow-data-change permits other data."
                                : "To continue the run saved there, pass --resume; to start another, choose another "
                                  "--ckpt-dir.");
  }
}

void print_resume(const TrainConfig& config, const std::optional<CheckpointEntry>& point,
                  const ResumeSettings& settings, std::ostream& out) {
  if (!point) {
    out << fmt::format("resume   no checkpoint of this run in {} yet: starting at step 0\n", config.ckpt_dir);
    return;
  }
  out << fmt::format("resume   from {} (step {})\n", point->path, point->step);
  if (!settings.overridden.empty()) {
    out << fmt::format("resume   the checkpoint's settings replace the command line's: {}\n",
                       fmt::join(settings.overridden, ", "));
  }
}

// How the run ended early: after a finished step, or during one (cut short
// between micro-batches and dropped).
void print_stop(const TrainConfig& config, const StepMetrics& last, int64_t steps_done, std::ostream& out) {
  const std::string when =
      last.interrupted_after_micro_batches
          ? fmt::format("during step {} of {}, after {} of its {} micro-batches (the step was dropped; a resume "
                        "redoes it)",
                        steps_done + 1, config.steps, *last.interrupted_after_micro_batches, config.grad_accum)
          : fmt::format("after step {} of {}", steps_done, config.steps);
  const std::string saved =
      config.ckpt_dir.empty() ? std::string("no --ckpt-dir, so nothing was saved")
      : steps_done == 0       ? std::string("no step finished, so nothing was saved")
                              : fmt::format("{} committed; continue with --resume",
                                            checkpoint_path(config.ckpt_dir, steps_done));
  out << fmt::format("stopped  on {} {}: {}\n", signal_name(last.stop_signal), when, saved);
  if (!config.export_path.empty()) out << fmt::format("export   skipped: the run did not reach step {}\n", config.steps);
}

// "tiny GPT on 4 ranks: 8192 tokens per step, lr 0.003 (warmup 20), seed 1337"
std::string loss_plot_title(const TrainConfig& run) {
  return fmt::format("{} {} on {} rank{}: {} tokens per step, lr {:g} (warmup {}), seed {}", run.preset,
                     run.family() == ModelFamily::gpt ? "GPT" : "Llama", run.nproc, run.nproc == 1 ? "" : "s",
                     run.tokens_per_step(), run.lr, run.warmup, run.seed);
}

// A failed save (a full disk, say) ends the run with what is left and what to do.
[[noreturn]] void fail_save(const CheckpointManager& checkpoints, const std::exception& error) {
  const std::optional<CheckpointEntry> newest = checkpoints.latest();
  tessera::fail("saving a checkpoint failed: {}\nIts partial files were removed; {}. Make space (or fix the cause), "
                "then continue with --resume.",
                error.what(),
                newest ? fmt::format("{} (step {}) is this run's newest checkpoint, intact", newest->path, newest->step)
                       : std::string("this run has no checkpoint yet"));
}

}  // namespace

TrainSummary train(const TrainConfig& config, std::ostream& out) {
  // A plan starts no rank and reads no data: any world size, any model (run_plan.h).
  if (config.plan) {
    before_start([&] {
      config.validate();
      check_plan_outputs(config);
    });
    print_plan(config, out);
    return TrainSummary{};
  }

  // Before anything is written: the flags, the machine's resources, every
  // file the run touches, and the data.
  const MachineResources machine = machine_resources();
  const std::vector<std::string> resource_warnings = before_start([&] {
    config.validate();
    tessera::dist::ProcessGroupOptions::from_environment();  // TESSERA_DIST_* in range
    return check_train_resources(config, machine);
  });
  const RunFiles files = before_start([&] { return settle_run_files(config); });
  const std::string loss_plot = before_start([&] { return settle_loss_plot(config); });
  const DataLoader data = before_start([&] { return build_data(config); });
  TrainSummary summary;
  summary.unigram_entropy = data.unigram_entropy();

  init_distributed(config, [&](const Distributed& distributed) {
    const bool leader = distributed.rank() == 0;

    // ---- before the first step: everything the run will need ----
    // The root first: a launch it refuses has not yet touched its outputs.
    const std::unique_ptr<CheckpointManager> checkpoints = open_checkpoints(config, data, distributed);
    std::optional<CheckpointEntry> resume_point;
    if (checkpoints && config.resume) resume_point = checkpoints->latest();
    ClaimedOutputs outputs = claim_outputs(config, files, loss_plot, distributed, resume_point);
    const ResumeSettings settings =
        resume_point ? settings_from_checkpoint(config, checkpoint::read_metadata(resume_point->path).training_state,
                                                resume_point->path)
                     : ResumeSettings{config, {}};
    const TrainConfig& run = settings.config;
    if (leader) {
      print_setup(run, data, out);
      out << "memory   "
          << describe_memory(estimate_rank_memory(run), ranks_on_machine(run, tessera::dist::detect_launch()), machine)
          << '\n';
      for (const std::string& warning : resource_warnings) out << "warning  " << warning << '\n';
      if (checkpoints) {
        for (const std::string& notice : checkpoints->notices()) out << "ckpt     " << notice << '\n';
      }
      for (const std::string& notice : files.notices) out << "files    " << notice << '\n';
      if (config.resume) print_resume(config, resume_point, settings, out);
      out.flush();
    }

    Trainer trainer(run, data, distributed);
    if (resume_point) trainer.resume_from(resume_point->path);
    // --init-from is where a run starts; with --resume, only when there is no checkpoint yet to continue.
    if (!run.init_from.empty() && !resume_point) {
      trainer.init_from(run.init_from);
      if (leader) out << fmt::format("init     weights from {}\n", run.init_from);
    } else if (!run.init_from.empty() && leader) {
      out << fmt::format("init     {} not read: resumed from step {}\n", run.init_from, resume_point->step);
    }
    // Each rank's own view of the run; the leader alone writes the summary
    // (the ranks may be threads sharing it).
    const int64_t first_step = trainer.steps_done() + 1;
    int stopped_by = 0;  // the signal that ended the run early, the same on every rank

    // Saves the finished steps (a stop's save is synchronous: the process is
    // about to exit) and returns how long training was blocked: for an async
    // save, the wait for the previous one and the snapshot copy.
    int64_t last_saved = resume_point ? resume_point->step : 0;
    const auto save = [&](bool in_background) {
      trainer.require_finite_state();
      const auto save_start = Clock::now();
      try {
        if (in_background) {
          checkpoints->async_save(trainer.steps_done(), trainer.state_dict(), trainer.training_state());
        } else {
          checkpoints->save(trainer.steps_done(), trainer.state_dict(), trainer.training_state());
        }
      } catch (const std::exception& error) {
        fail_save(*checkpoints, error);
      }
      last_saved = trainer.steps_done();
      return std::chrono::duration<double, std::milli>(Clock::now() - save_start).count();
    };

    // ---- the steps ----
    const auto start = Clock::now();
    StepMetrics metrics;
    for (int64_t step = first_step; step <= run.steps; ++step) {
      metrics = trainer.train_step();
      if (metrics.interrupted_after_micro_batches) {  // cut short: nothing to log, the last finished step to save
        stopped_by = metrics.stop_signal;
        tessera::dist::report_stopping_to_launcher();
        if (checkpoints && trainer.steps_done() > last_saved) save(false);
        break;
      }
      const bool last = step == run.steps;
      const bool stopping = metrics.stop_signal != 0 && !last;  // a stop in the last step just finishes
      if (stopping) tessera::dist::report_stopping_to_launcher();  // so that tools/launch says "stopped", not "done"
      if (!stopping && run.eval_every > 0 && (step % run.eval_every == 0 || last)) metrics.val_loss = trainer.evaluate();
      if (checkpoints && (stopping || last || (run.ckpt_every > 0 && step % run.ckpt_every == 0))) {
        metrics.ckpt_blocked_ms = save(run.async_ckpt && !stopping);
      }
      if (stopping) stopped_by = metrics.stop_signal;
      if (leader) {
        if (metrics.val_loss) {
          summary.val_loss = metrics.val_loss;
          summary.val_losses.emplace_back(step, *metrics.val_loss);
        }
        summary.losses.push_back(metrics.loss);
        out << format_progress(metrics) << '\n';
        if (metrics.ckpt_blocked_ms) {
          out << fmt::format("ckpt     {} ({}; training blocked {:.1f} ms)\n",
                             checkpoint_path(run.ckpt_dir, step),
                             run.async_ckpt && !stopping ? "async, writing in the background" : "sync, committed",
                             *metrics.ckpt_blocked_ms);
        }
        out.flush();
        if (outputs.log) outputs.log->write(to_json(metrics));
      }
      if (stopping) break;
    }
    if (checkpoints) {
      try {
        checkpoints->wait();
      } catch (const std::exception& error) {
        fail_save(*checkpoints, error);
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!run.export_path.empty() && stopped_by == 0) {
      trainer.require_finite_state();
      trainer.export_to(run.export_path);
      if (leader) {
        out << fmt::format("export   {} ({}, step {})\n", run.export_path,
                           run.export_format == "hf" ? "Hugging Face model directory" : "safetensors",
                           trainer.steps_done());
      }
    }

    if (distributed.tracer) {
      // Rank 0 writes the claimed temporary, then publishes it.
      tessera::dist::write_chrome_trace(*distributed.tracer, *distributed.world,
                                        outputs.trace ? outputs.trace->temporary() : files.trace);
      if (outputs.trace) outputs.trace->publish();
    }
    // Under MPI each process has its own summary (its exit status says how
    // it stopped); the local backend's ranks share one, written by rank 0.
    if (leader || run.backend == "mpi") {
      summary.first_step = first_step;
      summary.stop_signal = stopped_by;
    }
    if (!leader) return;
    summary.seconds = seconds;
    if (stopped_by != 0) {
      print_stop(run, metrics, trainer.steps_done(), out);
    } else if (summary.losses.empty()) {
      out << fmt::format("done     nothing to train: the run is at step {} of {}\n", trainer.steps_done(), run.steps);
    } else {
      out << fmt::format("done     {} steps in {:.1f} s: loss {:.4f} -> {:.4f}{}; unigram entropy {:.4f} nats\n",
                         run.steps, summary.seconds, summary.losses.front(), summary.losses.back(),
                         summary.val_loss ? fmt::format(" (val {:.4f})", *summary.val_loss) : std::string(),
                         summary.unigram_entropy);
    }
    if (distributed.tracer) out << fmt::format("trace    {} (open in ui.perfetto.dev)\n", files.trace);
    if (!loss_plot.empty() && !summary.losses.empty()) {
      write_loss_plot(*outputs.loss_plot, {first_step, summary.losses, summary.val_losses, summary.unigram_entropy},
                      loss_plot_title(run));
      out << fmt::format("plot     {} (loss of steps {} to {}; open it in a web browser)\n", loss_plot, first_step,
                         first_step + static_cast<int64_t>(summary.losses.size()) - 1);
    }
    out.flush();
  });
  return summary;
}

}  // namespace tessera::train
