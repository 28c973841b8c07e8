// CPU kernels: the functions behind cpu::kernel_table() (see tensor/kernels.h
// for each entry's contract). Grouped by the file that defines them.
#pragma once

#include "tensor/kernels.h"

namespace tessera::cpu {

// tensor/cpu/elementwise.cpp
void fill(const Tensor& out, double value);
void copy(const Tensor& dst, const Tensor& src);
void copy_segments(const std::vector<CopySegment>& segments);
void arange(const Tensor& out, double start, double step);
void random(const Tensor& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
            uint64_t first_index);
void unary(UnaryOp op, const Tensor& out, const Tensor& x);
void unary_backward(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved);
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void where(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b);
void dropout(const Tensor& y, const Tensor& mask, const Tensor& x, double p, PhiloxKey key,
             PhiloxNumbering numbering);

// tensor/cpu/reduction.cpp
void reduce(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
void max_along(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim);

// tensor/cpu/indexing.cpp
void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index);
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& source);

// tensor/cpu/matmul.cpp
void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);

// tensor/cpu/normalization.cpp
void softmax(const Tensor& out, const Tensor& x, bool log);
void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, bool log);
void norm(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
          const Tensor& bias, double eps);
void norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void add_norm(const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps);
void norm_backward_add(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                       const Tensor& grad_residual, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd);
void cross_entropy(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& targets,
                   int64_t ignore_index, int64_t classes);
void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                            const Tensor& logsumexp, const Tensor& targets, int64_t ignore_index, int64_t classes);

// tensor/cpu/attention.cpp
void causal_attention(const Tensor& out, const Tensor& logsumexp, const Tensor& q, const Tensor& k, const Tensor& v);
void causal_attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                               const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& logsumexp);

// tensor/cpu/quantization.cpp
void nf4_dequantize(const Tensor& out, const Tensor& packed);

// tensor/cpu/optimizer.cpp
void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWMoments& moments);
void sum_of_squares(const Tensor& total, const std::vector<Tensor>& tensors);
void scale_to_max_norm(const std::vector<Tensor>& tensors, const Tensor& total, double max_norm);
void check_index_range(const Tensor& indices, int64_t count, std::optional<int64_t> also_allowed,
                       const std::function<std::string(int64_t position, int64_t value)>& describe);

}  // namespace tessera::cpu
