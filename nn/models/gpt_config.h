// nn::GPTConfig: the shape and parameter dtype of a GPT-2 style model, named
// presets from a few-thousand-parameter test model to GPT-2 XL, and the
// parameter and FLOP counts that benchmarks report (MFU) without building it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace tessera::nn {

struct GPTConfig {
  int64_t vocab_size = 256;  // bytes
  // wte (and so the tied head) has vocab_size rounded up to a multiple of this
  // many rows. The extra rows are zero, never looked up, and their logits are
  // outside the softmax, so training is the same; what changes is that the
  // head's GEMMs get aligned leading dimensions (GPT-2's 50257 is odd, which
  // puts cuBLASLt on slow "align1" kernels). Megatron's
  // --make-vocab-size-divisible-by; 128 gives llm.c's 50304.
  int64_t vocab_padding_multiple = 1;
  int64_t block_size = 64;   // maximum sequence length T
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t n_embd = 64;  // C; must be a multiple of n_head
  double dropout = 0.0;  // embedding, attention-output and MLP-output dropout
  bool bias = true;      // biases in Linear and LayerNorm (GPT-2: true)
  double norm_eps = 1e-5;
  // Every parameter's dtype, hence the compute dtype (activations follow the
  // parameters). f64 is for oracles: it makes rounding noise ~1e-16, so runs
  // that sum in different orders can be compared tightly.
  DType dtype = DType::f32;

  // "nano"        1 layer,  2 heads,   16 dims, vocab 256,   T 32   (7,920 params; unit tests)
  // "tiny"        2 layers, 2 heads,   64 dims, vocab 256,   T 64   (120,576; trains on a CPU in seconds)
  // "gpt2-124m"  12 layers, 12 heads, 768 dims, vocab 50257, T 1024 (124,439,808 + 36,096 padding)
  // "gpt2-350m", "gpt2-774m", "gpt2-1558m": GPT-2 medium, large, XL.
  // The gpt2 presets pad the vocabulary to a multiple of 128 (50304 rows).
  // Unknown names throw, listing the known ones.
  static GPTConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // Throws tessera::Error naming the first inconsistent field.
  void validate() const;
  int64_t head_dim() const { return n_embd / n_head; }
  // wte's rows: vocab_size rounded up to vocab_padding_multiple.
  int64_t padded_vocab_size() const;

  // Parameters of the model as stored, the tied output head counted once (it
  // is wte), with Vp = padded_vocab_size():
  //   wte Vp*C + wpe T*C + L * (12 C^2 + 13 C) + ln_f 2C   (with biases)
  //   wte Vp*C + wpe T*C + L * (12 C^2 + 2 C)  + ln_f C    (without)
  int64_t num_parameters() const;
  // Training FLOPs (forward + backward) per token at sequence length
  // `seq_len`, the PaLM / nanoGPT estimate:
  //   6 * N + 12 * L * T * C
  // where N = num_parameters() - T_max * C - (Vp - V) * C (position
  // embeddings are a lookup, not a matmul; wte stays in, it is the output
  // head's matmul, but its padding rows are work no model needs) and the second
  // term is attention's QK^T and PV (2 matmuls of 2*T*C FLOPs per token
  // forward, times 3 for forward + backward).
  double flops_per_token(int64_t seq_len) const;
};

}  // namespace tessera::nn
