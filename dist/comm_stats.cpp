// Communication accounting: the names of the collectives, the per-rank byte
// volumes of a bandwidth-optimal algorithm for each (the formulas are in
// comm_stats.h), and a readable summary of a group's counters.
#include "dist/comm_stats.h"

#include <fmt/format.h>

#include "tensor/error.h"

namespace tessera::dist {

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_gather: return "all_gather_into";
    case CollectiveKind::reduce_scatter: return "reduce_scatter_into";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::all_gather_bytes: return "all_gather_bytes";
  }
  fail("collective_name: unknown collective kind {}", static_cast<int>(kind));
}

CollectiveStats CommStats::total() const {
  CollectiveStats sum;
  for (const CollectiveStats& kind : by_kind) {
    sum.calls += kind.calls;
    sum.bytes_sent += kind.bytes_sent;
    sum.bytes_received += kind.bytes_received;
    sum.seconds += kind.seconds;
  }
  return sum;
}

std::string human_bytes(int64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

namespace {

// Milliseconds, with enough decimals that a handful of microseconds is not "0.0".
std::string human_milliseconds(double seconds) {
  const double ms = seconds * 1e3;
  return ms >= 1.0 ? fmt::format("{:.1f} ms", ms) : fmt::format("{:.3f} ms", ms);
}

}  // namespace

std::string CommStats::to_string() const {
  std::string lines;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const CollectiveStats& stats = by_kind[static_cast<size_t>(k)];
    if (stats.calls == 0) continue;
    lines += fmt::format("{}: {} call{}, {} sent, {} received, {}\n", collective_name(static_cast<CollectiveKind>(k)),
                         stats.calls, stats.calls == 1 ? "" : "s", human_bytes(stats.bytes_sent),
                         human_bytes(stats.bytes_received), human_milliseconds(stats.seconds));
  }
  return lines;
}

// all_gather_bytes gathers byte strings whose lengths may differ; it counts
// as an all-gather of a `bytes`-long chunk (ProcessGroup passes the caller's
// own length: what this rank contributed, not the transport's padding or its
// exchange of lengths). A group of one moves nothing, whatever the kind.
CommVolume collective_volume(CollectiveKind kind, int64_t bytes, int group_size, bool is_root) {
  TESSERA_CHECK(bytes >= 0, "collective_volume: bytes must be >= 0, got {}", bytes);
  TESSERA_CHECK(group_size >= 1, "collective_volume: group size must be >= 1, got {}", group_size);
  const int64_t n = group_size;
  if (n == 1) return {};
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather_bytes: return {(n - 1) * bytes, (n - 1) * bytes};
    case CollectiveKind::all_reduce: {
      // Reduce-scatter then all-gather of S/N chunks: 2(N-1)/N * S each way.
      const int64_t volume = 2 * (n - 1) * bytes / n;
      return {volume, volume};
    }
    case CollectiveKind::broadcast: return is_root ? CommVolume{bytes, 0} : CommVolume{0, bytes};
    case CollectiveKind::barrier: return {};
  }
  fail("collective_volume: unknown collective kind {}", static_cast<int>(kind));
}

}  // namespace tessera::dist
