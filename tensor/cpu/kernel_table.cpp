// The CPU kernel table.
#include "tensor/cpu/cpu_kernels.h"

namespace tessera::cpu {

const KernelTable& kernel_table() {
  static const KernelTable table{
      .fill = fill,
      .copy = copy,
      .copy_segments = copy_segments,
      .arange = arange,
      .random = random,
      .unary = unary,
      .unary_backward = unary_backward,
      .binary = binary,
      .where = where,
      .reduce = reduce,
      .max_along = max_along,
      .index_select = index_select,
      .index_add = index_add,
      .matmul = matmul,
      .softmax = softmax,
      .softmax_backward = softmax_backward,
      .norm = norm,
      .norm_backward = norm_backward,
      .add_norm = add_norm,
      .norm_backward_add = norm_backward_add,
      .cross_entropy = cross_entropy,
      .cross_entropy_backward = cross_entropy_backward,
      .causal_attention = causal_attention,
      .causal_attention_backward = causal_attention_backward,
      .dropout = dropout,
      .nf4_dequantize = nf4_dequantize,
      .adamw_step = adamw_step,
      .sum_of_squares = sum_of_squares,
      .scale_to_max_norm = scale_to_max_norm,
      .check_index_range = check_index_range,
  };
  return table;
}

}  // namespace tessera::cpu
