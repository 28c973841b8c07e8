// The machine context benchmarks print, read from /proc.
#include "bench/machine_context.h"

#include <fstream>
#include <sstream>

#include "tensor/device.h"

namespace bench {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

std::string vector_isa() {
  const std::string compiled = tessera::cpu_instruction_set();
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string cpu;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream flags(line.substr(line.find(':') + 1));
    bool avx512 = false, avx2 = false, fma = false;
    for (std::string flag; flags >> flag;) avx512 |= flag == "avx512f", avx2 |= flag == "avx2", fma |= flag == "fma";
    cpu = avx512 ? "AVX-512" : avx2 && fma ? "AVX2+FMA" : "";
    break;
  }
  return cpu.empty() || cpu == compiled ? compiled : compiled + " (CPU: " + cpu + ")";
}

std::string load_average() {
  std::ifstream loadavg("/proc/loadavg");
  std::string one_minute;
  loadavg >> one_minute;
  return one_minute.empty() ? "?" : one_minute;
}

}  // namespace bench
