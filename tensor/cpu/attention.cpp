// CPU causal attention, forward and backward, in the flash-attention style:
// per (batch, head), query rows go in blocks against only the keys they may
// see; the backward rebuilds the probabilities from the saved log-sum-exp, so
// nothing [T, T] outlives one block's scratch. Operands are [B, H, T, D] with
// rows of D contiguous and any other strides (views of a packed projection,
// or the [B, T, H, D] order the heads merge back in).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/dtype_dispatch.h"
#include "tensor/cpu/lane_sum.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

namespace tessera::cpu {

namespace {

template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using HeadMap = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;  // one head: [T, D], rows apart by its row stride
template <typename T>
using ConstHeadMap = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;

constexpr int64_t kQueryBlock = 64;

struct Geometry {
  int64_t heads;            // B * H
  int64_t heads_per_batch;  // H
  int64_t seq;              // T
  int64_t dim;              // D
};

Geometry geometry_of(const Tensor& q) {
  return {q.size(0) * q.size(1), std::max<int64_t>(q.size(1), 1), q.size(2), q.size(3)};
}

// Head `index` (b * H + h) of a [B, H, T, D] tensor as a [T, D] matrix
// (Map: ConstHeadMap<T> or HeadMap<T>).
template <typename Map>
Map head_of(const Tensor& t, int64_t index, const Geometry& geometry) {
  using Scalar = std::remove_const_t<typename Map::Scalar>;
  const int64_t batch = index / geometry.heads_per_batch, head = index % geometry.heads_per_batch;
  return Map(t.data_ptr<Scalar>() + batch * t.stride(0) + head * t.stride(1), geometry.seq, geometry.dim,
             Eigen::OuterStride<>(t.stride(2)));
}

// The kernels read rows of D in place: each operand needs a unit stride along D.
void check_rows(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> operands) {
  for (const auto& [name, tensor] : operands) {
    TESSERA_CHECK(tensor->dim() == 4 && (tensor->stride(3) == 1 || tensor->size(3) == 1),
                  "cpu::{}: {} must be [B, H, T, D] with contiguous rows (a unit stride along D), got shape {} "
                  "strides {}",
                  op, name, tensor->sizes(), tensor->strides());
  }
}

// scores: [rows, keys] holds scale * q_i . k_j for query rows i = i0 + r; it is
// turned into the probabilities exp(score - lse_i) for j <= i and 0 above the diagonal.
template <typename T>
void block_probabilities(Eigen::Ref<Matrix<T>> scores, const T* lse, int64_t i0) {
  for (int64_t r = 0; r < scores.rows(); ++r) {
    const int64_t visible = i0 + r + 1;
    T* row = &scores(r, 0);
    vec::exp_shifted(row, row, visible, lse[i0 + r]);
    scores.row(r).tail(scores.cols() - visible).setZero();
  }
}

template <typename T>
void attention_typed(const Tensor& out, const Tensor& logsumexp, const Tensor& q, const Tensor& k, const Tensor& v) {
  // Plain variables, not a structured binding: clang before 16 cannot capture
  // one in the lambda below (tests/fuzz builds this file with clang 14).
  const Geometry geometry = geometry_of(q);
  const int64_t heads = geometry.heads, seq = geometry.seq, dim = geometry.dim;
  const T scale = T{1} / std::sqrt(static_cast<T>(dim));
  T* lse_data = logsumexp.data_ptr<T>();
  parallel_for(heads, 1, [&](int64_t begin, int64_t end) {
    Matrix<T> scores(std::min(kQueryBlock, seq), seq);
    for (int64_t head = begin; head < end; ++head) {
      const auto Q = head_of<ConstHeadMap<T>>(q, head, geometry), K = head_of<ConstHeadMap<T>>(k, head, geometry),
                 V = head_of<ConstHeadMap<T>>(v, head, geometry);
      HeadMap<T> O = head_of<HeadMap<T>>(out, head, geometry);
      T* lse = lse_data + head * seq;
      for (int64_t i0 = 0; i0 < seq; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, seq - i0), keys = i0 + rows;
        auto S = scores.topLeftCorner(rows, keys);
        // S: [rows, keys] = scale * Q[i0:i0+rows] @ K[0:keys]^T
        S.noalias() = (scale * Q.middleRows(i0, rows)) * K.topRows(keys).transpose();
        // Row-wise stable softmax over the visible keys; the masked tail is zero.
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t visible = i0 + r + 1;
          auto row = S.row(r).head(visible).array();
          const T max = row.maxCoeff();
          vec::exp_shifted(&S(r, 0), &S(r, 0), visible, max);
          const double sum = lane_sum(&S(r, 0), visible);
          lse[i0 + r] = static_cast<T>(static_cast<double>(max) + std::log(sum));
          row *= static_cast<T>(1.0 / sum);
          S.row(r).tail(keys - visible).setZero();
        }
        // O[i0:i0+rows]: [rows, D] = P @ V[0:keys]
        O.middleRows(i0, rows).noalias() = S * V.topRows(keys);
      }
    }
  });
}

template <typename T>
void attention_backward_typed(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                              const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& logsumexp) {
  // Plain variables, not a structured binding: see attention_typed.
  const Geometry geometry = geometry_of(q);
  const int64_t heads = geometry.heads, seq = geometry.seq, dim = geometry.dim;
  const T scale = T{1} / std::sqrt(static_cast<T>(dim));
  const T* lse_data = logsumexp.data_ptr<T>();
  parallel_for(heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(kQueryBlock, seq);
    Matrix<T> probs(block, seq), grad_probs(block, seq);
    Eigen::Array<T, Eigen::Dynamic, 1> delta(seq);
    for (int64_t head = begin; head < end; ++head) {
      const auto Q = head_of<ConstHeadMap<T>>(q, head, geometry), K = head_of<ConstHeadMap<T>>(k, head, geometry),
                 V = head_of<ConstHeadMap<T>>(v, head, geometry), O = head_of<ConstHeadMap<T>>(out, head, geometry),
                 dO = head_of<ConstHeadMap<T>>(grad_out, head, geometry);
      HeadMap<T> dQ = head_of<HeadMap<T>>(grad_q, head, geometry), dK = head_of<HeadMap<T>>(grad_k, head, geometry),
                 dV = head_of<HeadMap<T>>(grad_v, head, geometry);
      const T* lse = lse_data + head * seq;
      // delta_i = dO_i . O_i = sum_j P_ij dP_ij, the softmax backward's row term.
      for (int64_t i = 0; i < seq; ++i) delta[i] = static_cast<T>(lane_dot(dO.row(i).data(), O.row(i).data(), dim));
      dK.setZero();
      dV.setZero();
      for (int64_t i0 = 0; i0 < seq; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, seq - i0), keys = i0 + rows;
        auto P = probs.topLeftCorner(rows, keys);
        auto dS = grad_probs.topLeftCorner(rows, keys);
        P.noalias() = (scale * Q.middleRows(i0, rows)) * K.topRows(keys).transpose();
        block_probabilities<T>(P, lse, i0);
        // dV[0:keys] += P^T @ dO_blk; dP = dO_blk @ V[0:keys]^T
        dV.topRows(keys).noalias() += P.transpose() * dO.middleRows(i0, rows);
        dS.noalias() = dO.middleRows(i0, rows) * V.topRows(keys).transpose();
        // dS = P * (dP - delta), zero where P is masked out.
        dS.array() = P.array() * (dS.array().colwise() - delta.segment(i0, rows));
        dQ.middleRows(i0, rows).noalias() = (scale * dS) * K.topRows(keys);
        dK.topRows(keys).noalias() += (scale * dS.transpose()) * Q.middleRows(i0, rows);
      }
    }
  });
}

}  // namespace

void causal_attention(const Tensor& out, const Tensor& logsumexp, const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.numel() == 0) return;
  check_rows("causal_attention", {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}});
  TESSERA_CHECK(logsumexp.is_contiguous(), "cpu::causal_attention: logsumexp must be contiguous");
  visit_float_dtype(q.dtype(), "causal_attention",
                 [&]<typename T>(T) { attention_typed<T>(out, logsumexp, q, k, v); });
}

void causal_attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                               const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& logsumexp) {
  if (q.numel() == 0) return;
  check_rows("causal_attention_backward", {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"grad_out", &grad_out},
                                           {"grad_q", &grad_q}, {"grad_k", &grad_k}, {"grad_v", &grad_v}});
  TESSERA_CHECK(logsumexp.is_contiguous(), "cpu::causal_attention_backward: logsumexp must be contiguous");
  visit_float_dtype(q.dtype(), "causal_attention_backward", [&]<typename T>(T) {
    attention_backward_typed<T>(grad_q, grad_k, grad_v, grad_out, q, k, v, out, logsumexp);
  });
}

}  // namespace tessera::cpu
