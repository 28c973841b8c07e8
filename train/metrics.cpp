// Progress lines, JSON lines and the process's peak memory.
#include "train/metrics.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "tensor/error.h"

namespace tessera::train {

std::string format_bytes(int64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", value / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", value / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", value / (1 << 10));
  return fmt::format("{} B", bytes);
}

std::string format_progress(const StepMetrics& m) {
  std::string line = fmt::format(
      "step {:5d} | loss {:.4f} | lr {:.2e} | grad norm {:7.4f} | {:8.1f} ms | {:9.0f} tok/s | {:6.2f} GFLOP/s | "
      "peak mem/rank {} (rss {}) | sent/rank {}",
      m.step, m.loss, m.lr, m.grad_norm, m.step_ms, m.tokens_per_s, m.gflops_per_s, format_bytes(m.peak_mem_bytes),
      format_bytes(m.peak_rss_bytes), format_bytes(m.comm_bytes));
  if (m.val_loss) line += fmt::format(" | val loss {:.4f}", *m.val_loss);
  return line;
}

nlohmann::ordered_json to_json(const StepMetrics& m) {
  nlohmann::ordered_json object = {
      {"step", m.step},
      {"loss", m.loss},
      {"lr", m.lr},
      {"grad_norm", m.grad_norm},
      {"step_ms", m.step_ms},
      {"tokens_per_s", m.tokens_per_s},
      {"gflops_per_s", m.gflops_per_s},
      {"peak_mem_bytes", m.peak_mem_bytes},
      {"peak_rss_bytes", m.peak_rss_bytes},
      {"comm_bytes", m.comm_bytes},
  };
  if (m.val_loss) object["val_loss"] = *m.val_loss;
  if (m.ckpt_blocked_ms) object["ckpt_blocked_ms"] = *m.ckpt_blocked_ms;
  return object;
}

int64_t process_peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    int64_t kib = 0;
    fields >> kib;  // "VmHWM:   123456 kB"
    return kib * 1024;
  }
  return 0;
}

}  // namespace tessera::train
