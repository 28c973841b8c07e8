// fsdp::ReshardAfterForward: the checks and the resolution against a shard group.
#include "fsdp/reshard_after_forward.h"

#include "tensor/error.h"

namespace tessera::fsdp {

ReshardAfterForward ReshardAfterForward::to_group_of(int64_t ranks) {
  TESSERA_CHECK(ranks >= 1, "ReshardAfterForward::to_group_of: the group size must be >= 1 rank, got {}", ranks);
  return ReshardAfterForward(Ranks{ranks});
}

std::optional<int64_t> ReshardAfterForward::group_size() const {
  if (ranks_ == kAlways || ranks_ == 1) return std::nullopt;
  return ranks_;
}

int64_t ReshardAfterForward::shards_after_forward(int64_t shard_group_size) const {
  TESSERA_CHECK(shard_group_size >= 1, "ReshardAfterForward: the shard group size must be >= 1, got {}",
                shard_group_size);
  if (ranks_ == kAlways) return shard_group_size;
  TESSERA_CHECK(ranks_ <= shard_group_size && shard_group_size % ranks_ == 0,
                "reshard_after_forward = {} must divide the shard group size {} (1 = false, {} = true)", ranks_,
                shard_group_size, shard_group_size);
  return ranks_;
}

ReshardAfterForward ReshardAfterForward::resolved(int64_t shard_group_size) const {
  const int64_t shards = shards_after_forward(shard_group_size);
  if (shards == 1) return never();
  if (shards == shard_group_size) return always();
  return *this;
}

std::string ReshardAfterForward::to_string() const {
  if (ranks_ == kAlways) return "true";
  if (ranks_ == 1) return "false";
  return std::to_string(ranks_);
}

}  // namespace tessera::fsdp
