// The machine context benchmarks print, read from /proc.
#include "bench/machine_context.h"

#include <fstream>

namespace bench {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

std::string load_average() {
  std::ifstream loadavg("/proc/loadavg");
  std::string one_minute;
  loadavg >> one_minute;
  return one_minute.empty() ? "?" : one_minute;
}

}  // namespace bench
