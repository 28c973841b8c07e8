// nn::RotaryEmbedding: the angle tables and the pairwise rotation.
#include "nn/rotary_embedding.h"

#include <cmath>
#include <vector>

#include "autograd/functions.h"

namespace tessera::nn {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_seq_len, RotaryEmbeddingOptions options)
    : Module("RotaryEmbedding"), head_dim_(head_dim), max_seq_len_(max_seq_len), theta_(options.theta) {
  TESSERA_CHECK(head_dim > 0 && head_dim % 2 == 0, "RotaryEmbedding: head_dim must be positive and even, got {}",
                head_dim);
  TESSERA_CHECK(max_seq_len > 0, "RotaryEmbedding: max_seq_len must be positive, got {}", max_seq_len);
  TESSERA_CHECK(options.theta > 1.0, "RotaryEmbedding: theta must be greater than 1, got {}", options.theta);
  TESSERA_CHECK(is_floating(options.dtype), "RotaryEmbedding: the tables need a floating dtype, got {}",
                dtype_name(options.dtype));
  const TensorOptions meta{.dtype = options.dtype, .device = kMeta};
  register_buffer("cos", ops::empty({max_seq_len, head_dim / 2}, meta), /*persistent=*/false);
  register_buffer("sin", ops::empty({max_seq_len, head_dim / 2}, meta), /*persistent=*/false);
  materialize(options.device);
}

void RotaryEmbedding::compute_own_buffers() {
  // Angles in double whatever the tables' dtype: the tables are then rounded
  // once, the same on every device.
  const int64_t pairs = head_dim_ / 2;
  std::vector<double> cos_table(static_cast<size_t>(max_seq_len_ * pairs));
  std::vector<double> sin_table(cos_table.size());
  for (int64_t t = 0; t < max_seq_len_; ++t) {
    for (int64_t i = 0; i < pairs; ++i) {
      const double frequency = std::pow(theta_, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim_));
      const double angle = static_cast<double>(t) * frequency;
      cos_table[static_cast<size_t>(t * pairs + i)] = std::cos(angle);
      sin_table[static_cast<size_t>(t * pairs + i)] = std::sin(angle);
    }
  }
  Tensor cos = buffer("cos");
  Tensor sin = buffer("sin");
  ops::copy_(cos, ops::from_vector(cos_table, cos.sizes(), {.dtype = DType::f64}));
  ops::copy_(sin, ops::from_vector(sin_table, sin.sizes(), {.dtype = DType::f64}));
}

Tensor RotaryEmbedding::forward(const Tensor& x) {
  TESSERA_CHECK(x.dim() == 4 && x.size(3) == head_dim_ && x.size(1) <= max_seq_len_,
                "RotaryEmbedding: expected input [B, T <= {}, H, {}], got {}", max_seq_len_, head_dim_, x.sizes());
  const int64_t T = x.size(1), pairs = head_dim_ / 2;
  // [max_seq_len, D/2] -> [T, 1, D/2], broadcast over batch and heads.
  auto table = [&](const char* name) {
    const Tensor rows = ops::narrow(buffer(name), 0, 0, T);
    return ops::view(ops::to(ops::contiguous(rows), x.dtype()), {T, 1, pairs});
  };
  return rotate(x, table("cos"), table("sin"));
}

Tensor RotaryEmbedding::forward_at(const Tensor& x, const Tensor& positions) {
  TESSERA_CHECK(x.dim() == 4 && x.size(3) == head_dim_, "RotaryEmbedding: expected input [B, T, H, {}], got {}",
                head_dim_, x.sizes());
  const int64_t B = x.size(0), T = x.size(1), pairs = head_dim_ / 2;
  TESSERA_CHECK(positions.defined() && positions.sizes() == Shape({B, T}) &&
                    (positions.dtype() == DType::i64 || positions.dtype() == DType::i32),
                "RotaryEmbedding: positions must be [B, T] = [{}, {}] i32/i64, got {} {}", B, T,
                positions.defined() ? positions.sizes() : Shape{},
                positions.defined() ? dtype_name(positions.dtype()) : "undefined");
  // [max_seq_len, D/2] -> the rows of the positions [B*T, D/2] -> [B, T, 1, D/2],
  // broadcast over heads (index_select refuses a position outside the table).
  const Tensor flat_positions = ops::reshape(positions, {B * T});
  auto table = [&](const char* name) {
    const Tensor rows = ops::index_select(buffer(name), 0, flat_positions);
    return ops::view(ops::to(rows, x.dtype()), {B, T, 1, pairs});
  };
  return rotate(x, table("cos"), table("sin"));
}

Tensor RotaryEmbedding::rotate(const Tensor& x, const Tensor& cos, const Tensor& sin) const {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), pairs = head_dim_ / 2;
  // [B, T, H, D] -> [B, T, H, D/2, 2]: the pairs.
  const Tensor pairs_view = tessera::reshape(x, {B, T, H, pairs, 2});
  const Tensor even = tessera::select(pairs_view, 4, 0);  // [B, T, H, D/2]
  const Tensor odd = tessera::select(pairs_view, 4, 1);
  const Tensor rotated_even = tessera::sub(tessera::mul(even, cos), tessera::mul(odd, sin));
  const Tensor rotated_odd = tessera::add(tessera::mul(even, sin), tessera::mul(odd, cos));
  return tessera::reshape(tessera::stack({rotated_even, rotated_odd}, 4), {B, T, H, head_dim_});
}

}  // namespace tessera::nn
