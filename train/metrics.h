// What the training loop reports after each optimizer step: a progress line
// for people and a JSON object for programs (--log-json: step_log.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::train {

struct StepMetrics {
  int64_t step = 0;  // 1-based count of optimizer steps done
  double loss = 0.0;  // mean over the step's micro-batches
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
  double gflops_per_s = 0.0;  // model FLOPs (forward + backward) per second
  int64_t peak_mem_bytes = 0;  // during the step, the largest rank's (tessera's allocator, per rank)
  int64_t peak_rss_bytes = 0;  // the process's (VmHWM; all local ranks together)
  int64_t comm_bytes = 0;      // bytes one rank sent during the step (FSDP's collectives and the trainer's)
  std::optional<double> val_loss;  // set on evaluation steps
  std::optional<double> ckpt_blocked_ms;  // set on checkpoint steps: how long the save held training up
  int stop_signal = 0;  // a stop signal (GracefulStop) received by any rank by the end of the step; 0: none
  // Set when the stop came between micro-batches: the step was cut short after
  // this many and not applied (step is then the last finished one).
  std::optional<int64_t> interrupted_after_micro_batches;
};

// "step   10 | loss 3.1234 | lr 6.00e-04 | ..." on one line.
std::string format_progress(const StepMetrics& metrics);
nlohmann::ordered_json to_json(const StepMetrics& metrics);

// "12.3 MiB"
std::string format_bytes(int64_t bytes);

// The process's peak resident set (VmHWM of /proc/self/status) in bytes; 0
// where the kernel does not report it.
int64_t process_peak_rss_bytes();

}  // namespace tessera::train
