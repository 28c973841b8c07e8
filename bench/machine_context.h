// What a benchmark prints about the machine it ran on, so that figures are
// read with their context: the CPU model, the vector instruction set the
// build uses, and the load while it ran.
#pragma once

#include <string>

namespace bench {

// /proc/cpuinfo's "model name", or "unknown CPU".
std::string cpu_model();
// The vector instruction set this build was compiled for ("AVX-512",
// "AVX2+FMA", ...), and the CPU's own when it has more: "AVX2+FMA (CPU: AVX-512)".
std::string vector_isa();
// The one-minute load average from /proc/loadavg, or "?".
std::string load_average();

}  // namespace bench
