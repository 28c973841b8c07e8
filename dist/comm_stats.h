// Communication accounting per process group: calls, bytes and time per kind
// of collective. Bytes are what each rank must send and receive for the
// collective's result with a bandwidth-optimal algorithm (the volumes behind
// nccl-tests' bus bandwidth), so numbers compare across backends:
//   all-gather, reduce-scatter (N ranks, per-rank chunk c bytes): (N-1)c each way
//   all-reduce of S bytes: 2(N-1)/N * S each way
//   broadcast of S bytes: root sends S, every other rank receives S
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::dist {

enum class CollectiveKind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, all_gather_bytes };
constexpr int kNumCollectiveKinds = 6;

// "all_gather_into", "reduce_scatter_into", "all_reduce", "broadcast", "barrier", "all_gather_bytes".
std::string_view collective_name(CollectiveKind kind);

struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double seconds = 0;  // time spent running, from start on the comm thread to completion
};

struct CommStats {
  std::array<CollectiveStats, kNumCollectiveKinds> by_kind{};

  const CollectiveStats& operator[](CollectiveKind kind) const { return by_kind[static_cast<size_t>(kind)]; }
  CollectiveStats& operator[](CollectiveKind kind) { return by_kind[static_cast<size_t>(kind)]; }
  CollectiveStats total() const;
  // One line per kind that was called: "all_gather_into: 12 calls, 3.0 MiB sent, 3.0 MiB received, 4.1 ms".
  std::string to_string() const;
};

// The per-rank volumes above, for a collective moving `bytes` (the per-rank
// chunk for all-gather and reduce-scatter, the whole tensor otherwise).
struct CommVolume {
  int64_t sent = 0;
  int64_t received = 0;
};
CommVolume collective_volume(CollectiveKind kind, int64_t bytes, int group_size, bool is_root);

// "512 B", "3.0 KiB", "12.5 MiB", "1.2 GiB".
std::string human_bytes(int64_t bytes);

}  // namespace tessera::dist
