// Where in a kernel's source an access was made. The instrumentation hooks
// know only their return address, so a fault symbolises it through the
// kernel units' line tables (they are compiled with -g1) with GCC's
// libbacktrace; the intrinsics know their caller's std::source_location.
#pragma once

#include <bit>
#include <cstdint>
#include <source_location>
#include <string>

namespace tessera::cuda::sim {

struct CodeSite {
  const void* code = nullptr;          // a return address into kernel code, or
  std::source_location source = {};   // where an intrinsic was called (line 0: none)
};

// A CodeSite in one word, for racecheck's per-byte shadow: the return
// address, or (tagged in the top bit, which user-space addresses leave
// clear) the source_location's pointer to its static data.
static_assert(sizeof(std::source_location) == sizeof(uintptr_t));
inline constexpr uintptr_t kSourceTag = uintptr_t{1} << 63;
inline uintptr_t pack(const CodeSite& site) {
  if (site.source.line() == 0) return reinterpret_cast<uintptr_t>(site.code);
  return std::bit_cast<uintptr_t>(site.source) | kSourceTag;
}
inline CodeSite unpack(uintptr_t packed) {
  if ((packed & kSourceTag) == 0) return CodeSite{reinterpret_cast<const void*>(packed)};
  return CodeSite{nullptr, std::bit_cast<std::source_location>(packed & ~kSourceTag)};
}

// "tests/cuda/simulator_kernels.cu:120", with the functions inlined there
// when the line tables name them; "an unknown site" when neither is known.
std::string describe(const CodeSite& site);

// A source file named from the repository root ("tests/cuda/x.cu"), as
// std::source_location names the kernel sources.
std::string relative_source_path(const std::string& file);

// "file:line" of an intrinsic's call, as the simulator's messages name it.
std::string site_name(const std::source_location& site);
// Whether two calls are at one place in the source (line, column and file).
bool same_site(const std::source_location& a, const std::source_location& b);

}  // namespace tessera::cuda::sim
