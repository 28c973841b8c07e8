// cooperative_groups::reduce for the simulator (see ../cooperative_groups.h):
// a tile's values combined by plus, less (the minimum), greater (the
// maximum), bit_and, bit_or or bit_xor, every lane getting the result, by a
// butterfly of shfl_xor. The toolkit may combine in another order, so a float
// sum can differ from the GPU's in its last bits; integers, minima and maxima
// are exact either way.
#pragma once

#include "cooperative_groups.h"

namespace cooperative_groups {

template <typename T>
struct plus {
  T operator()(const T& a, const T& b) const { return a + b; }
};
template <typename T>
struct less {
  T operator()(const T& a, const T& b) const { return b < a ? b : a; }
};
template <typename T>
struct greater {
  T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};
template <typename T>
struct bit_and {
  T operator()(const T& a, const T& b) const { return a & b; }
};
template <typename T>
struct bit_or {
  T operator()(const T& a, const T& b) const { return a | b; }
};
template <typename T>
struct bit_xor {
  T operator()(const T& a, const T& b) const { return a ^ b; }
};

template <unsigned Size, typename T, typename Op>
T reduce(const thread_block_tile<Size>& tile, T value, Op op) {
  for (unsigned lane_mask = Size / 2; lane_mask > 0; lane_mask /= 2) value = op(value, tile.shfl_xor(value, lane_mask));
  return value;
}

}  // namespace cooperative_groups
