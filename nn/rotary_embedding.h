// nn::RotaryEmbedding: rotary position embeddings (RoPE, Su et al. 2021) in
// the interleaved layout of Meta's Llama: each pair (x[2i], x[2i+1]) of a
// head is rotated by the angle t * theta^(-2i/D) at position t,
//   out[2i]   = x[2i] cos - x[2i+1] sin
//   out[2i+1] = x[2i] sin + x[2i+1] cos.
// The cos and sin tables are non-persistent buffers [max_seq_len, D/2]: built
// from the options (compute_own_buffers), so they are meta on meta, filled by
// to_empty on a real device, and never stored in a checkpoint.
#pragma once

#include "nn/module.h"

namespace tessera::nn {

struct RotaryEmbeddingOptions {
  double theta = 10000.0;  // Llama 2; Llama 3 uses 500000
  Device device = kCPU;
  DType dtype = DType::f32;  // of the tables; forward converts them to x's dtype
};

class RotaryEmbedding : public Module {
 public:
  // head_dim D must be even; positions run from 0 to max_seq_len - 1.
  RotaryEmbedding(int64_t head_dim, int64_t max_seq_len, RotaryEmbeddingOptions options = {});

  // x: [B, T, H, D] with T <= max_seq_len, positions 0..T-1 -> [B, T, H, D]
  Tensor forward(const Tensor& x) override;
  // x: [B, T, H, D] at positions [B, T] (i32/i64, each in [0, max_seq_len),
  // on x's device): a cached forward's new tokens, or a left-padded batch.
  // The same bits as forward where the positions are 0..T-1.
  Tensor forward_at(const Tensor& x, const Tensor& positions);

  int64_t head_dim() const { return head_dim_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  double theta() const { return theta_; }

 protected:
  void compute_own_buffers() override;

 private:
  // x: [B, T, H, D] rotated by the angle tables cos, sin: [T or B*T rows, D/2]
  // viewed to broadcast against x's [B, T, H, D/2] pairs.
  Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin) const;

  int64_t head_dim_;
  int64_t max_seq_len_;
  double theta_;
};

}  // namespace tessera::nn
