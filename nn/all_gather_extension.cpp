// The extension's default answer to a plan: it cannot say.
#include "nn/all_gather_extension.h"

#include "tensor/error.h"

namespace tessera::nn {

std::vector<PayloadSize> AllGatherExtension::payload_sizes(const Shape& padded_shard_shape, DType, DType) const {
  tessera::fail("the all-gather extension {} does not say what it gathers for a shard of {} (payload_sizes), so a "
                "sharding plan cannot count its bytes",
                name(), padded_shard_shape);
}

}  // namespace tessera::nn
