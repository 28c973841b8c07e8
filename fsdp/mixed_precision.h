// fsdp::MixedPrecisionPolicy: the dtypes FSDP uses around a module, as in
// FSDP2. On the CPU, bf16/f16 are storage and communication types: kernels
// widen them to f32 to compute, so bf16 parameters halve all-gather bytes and
// unsharded memory while the arithmetic stays f32.
#pragma once

#include <optional>

#include "tensor/dtype.h"

namespace tessera::fsdp {

struct MixedPrecisionPolicy {
  // The dtype of the unsharded parameters (what forward and backward use and
  // what the all-gather moves). Unset: the parameter's own dtype.
  std::optional<DType> param_dtype = std::nullopt;
  // The dtype gradients are reduce-scattered in. Unset: param_dtype (or the
  // parameter's own). The sharded gradient is always in the parameter's dtype.
  std::optional<DType> reduce_dtype = std::nullopt;
  // Floating outputs of the module are cast to this. Unset: left alone.
  std::optional<DType> output_dtype = std::nullopt;
  // Floating inputs are cast to param_dtype before forward.
  bool cast_forward_inputs = true;
};

}  // namespace tessera::fsdp
