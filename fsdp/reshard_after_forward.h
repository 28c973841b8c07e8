// fsdp::ReshardAfterForward: what an FSDP module does with its unsharded
// parameters once its forward is done - FSDP2's reshard_after_forward, which
// is True, False or an int there:
//
//   always()        (true)  free them; backward all-gathers them again over
//                           the shard group (the least memory);
//   never()         (false) keep them until after backward (no second
//                           all-gather; the most memory);
//   to_group_of(N)  (N)     keep this rank's rows of an N-way sharding, so
//                           the backward all-gather spans N ranks only (N
//                           must divide the shard group size S).
//
//   fully_shard(block, {.reshard_after_forward = false});
//   fully_shard(block, {.reshard_after_forward = ReshardAfterForward::to_group_of(2)});
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>

namespace tessera::fsdp {

class ReshardAfterForward {
 public:
  static ReshardAfterForward always() { return ReshardAfterForward(Ranks{kAlways}); }
  static ReshardAfterForward never() { return ReshardAfterForward(Ranks{1}); }
  // Throws tessera::Error unless ranks >= 1; to_group_of(1) is never().
  static ReshardAfterForward to_group_of(int64_t ranks);

  // true and false read as in FSDP2 (`.reshard_after_forward = false`). Only
  // a bool converts: an integer would mean a group size, so it must be
  // written to_group_of(N).
  template <std::same_as<bool> Bool>
  ReshardAfterForward(Bool reshard) : ranks_(reshard ? kAlways : 1) {}  // NOLINT(google-explicit-constructor)

  bool is_always() const { return ranks_ == kAlways; }
  bool is_never() const { return ranks_ == 1; }
  // N of to_group_of(N) for N >= 2; nullopt for always() and never().
  std::optional<int64_t> group_size() const;

  // How many ways the parameters are split between forward and backward on
  // a shard group of `shard_group_size` ranks (S): S for always(), 1 (whole)
  // for never(), N for to_group_of(N). Throws tessera::Error naming N and S
  // unless N divides S.
  int64_t shards_after_forward(int64_t shard_group_size) const;
  // The same behaviour on S ranks in its plainest form: to_group_of(S) is
  // always(), and on one rank always() is never() (nothing to gather).
  ReshardAfterForward resolved(int64_t shard_group_size) const;

  bool operator==(const ReshardAfterForward&) const = default;
  // As FSDP2 writes the setting: "true", "false" or the group size ("2").
  std::string to_string() const;

 private:
  static constexpr int64_t kAlways = -1;
  struct Ranks {
    int64_t value;
  };
  explicit ReshardAfterForward(Ranks ranks) : ranks_(ranks.value) {}

  int64_t ranks_;  // kAlways, 1 (never), or N >= 2
};

}  // namespace tessera::fsdp
