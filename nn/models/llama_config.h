// nn::LlamaConfig: the shape of a Llama-style decoder (RMSNorm, rotary GQA,
// SwiGLU, untied head), presets from a test model to Llama 3 8B, and the
// parameter and FLOP counts that plans and benchmarks report without
// building it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace tessera::nn {

struct LlamaConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t block_size = 64;   // maximum sequence length T (the RoPE tables' rows)
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_kv_head = 2;  // divides n_head; n_head / n_kv_head query heads share a kv head
  int64_t n_embd = 64;    // C; a multiple of n_head with an even head_dim
  int64_t ffn_hidden = 192;  // SwiGLU's F
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  DType dtype = DType::f32;  // every parameter's dtype (f64 for oracles)

  // "llama-nano"   1 layer,  2 heads (1 kv),  16 dims, F 48,    vocab 256,    T 32   (unit tests)
  // "llama-tiny"   2 layers, 4 heads (2 kv),  64 dims, F 192,   vocab 256,    T 64   (trains on a CPU in seconds)
  // "llama-125m"  12 layers, 12 heads (4 kv), 768 dims, F 2048, vocab 32000,  T 1024
  // "llama2-7b"   32 layers, 32 heads (32 kv), 4096 dims, F 11008, vocab 32000, T 4096 (6,738,415,616 params)
  // "llama3-8b"   32 layers, 32 heads (8 kv), 4096 dims, F 14336, vocab 128256, T 8192, theta 500000
  // Unknown names throw, listing the known ones.
  static LlamaConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // Throws tessera::Error naming the first inconsistent field.
  void validate() const;

  int64_t head_dim() const { return n_embd / n_head; }
  // tok_embeddings V*C + output V*C + norm C
  //   + L * (wq C*C + wk, wv 2*C*Hkv*D + wo C*C + SwiGLU 3*C*F + two norms 2C)
  int64_t num_parameters() const;
  // Training FLOPs per token at sequence length seq_len: 6 * N + 12 * L * T * C,
  // N without tok_embeddings (a lookup; the untied output head is a matmul
  // and stays in). Attention's score and value matmuls cost the same with
  // grouped kv heads: every query head still attends.
  double flops_per_token(int64_t seq_len) const;
};

}  // namespace tessera::nn
