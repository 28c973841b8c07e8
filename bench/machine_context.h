// What a benchmark prints about the machine it ran on, so that figures are
// read with their context: the CPU model and the load while it ran.
#pragma once

#include <string>

namespace bench {

// /proc/cpuinfo's "model name", or "unknown CPU".
std::string cpu_model();
// The one-minute load average from /proc/loadavg, or "?".
std::string load_average();

}  // namespace bench
