// tessera::CopySegment: one piece of a multi-tensor copy (ops::copy_segments,
// KernelTable::copy_segments). FSDP's copy-in, copy-out and casts are lists
// of these, so that a device moves a whole parameter group in one kernel
// launch instead of one or two per parameter.
#pragma once

#include "tensor/tensor.h"

namespace tessera {

// dst <- src element by element in row-major order, converting between float
// dtypes as ops::copy_ does; with src undefined, dst <- value everywhere
// (converted to dst's dtype as ops::fill_ converts it).
struct CopySegment {
  Tensor dst{};
  Tensor src{};
  double value = 0.0;
};

}  // namespace tessera
