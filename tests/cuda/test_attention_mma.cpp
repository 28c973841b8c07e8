// Causal attention on tensor cores (tensor/cuda/attention_mma.cu): bf16 q, k,
// v at head dims 64 and 128 route there, and its out, logsumexp, dq, dk and
// dv are held to an f64 reference on the same bf16 inputs and to the
// CUDA-core kernel (attention.cu, f32 on the widened inputs) within a bound
// derived below; around the 64-row tiles (T = 1, odd T, several tiles),
// B * H > 1, strided heads as the model passes them (and the model's own
// path: a split projection through autograd), the fallback for unaligned
// views and other head dims, the same bits in any block order, and
// (simulator) the tiling's device bytes and the shared-memory bytes per
// (query, key) pair against the CUDA-core kernel's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tensor/cuda/attention.h"
#include "tensor/cuda/attention_mma.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"
#include "tests/cuda/counted_bytes.h"

using namespace tessera;
using tessera::testing::launched_kernels;

namespace {

const Device kCuda(DeviceType::cuda);

// [B, H, T, D] tensors on the cpu, bf16 values.
struct Inputs {
  Tensor q, k, v, grad_out;
};

Inputs make_inputs(const Shape& shape, uint64_t seed) {
  const auto draw = [&](uint64_t stream) { return ops::to(ops::randn(shape, PhiloxKey{seed, stream}), DType::bf16); };
  return {draw(1), draw(2), draw(3), draw(4)};
}

std::vector<double> values_of(const Tensor& t) {  // any device, dtype or layout; row-major order
  const Tensor host = ops::contiguous(ops::to(ops::to(t, kCPU), DType::f64));
  const auto* data = static_cast<const double*>(host.raw_data());
  return std::vector<double>(data, data + host.numel());
}

[[maybe_unused]] bool launches(const std::vector<std::string>& names, const std::string& part) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& name) { return name.find(part) != std::string::npos; });
}

// What one device run gives, on the cpu as f64 values.
struct Results {
  std::vector<double> out, logsumexp, grad_q, grad_k, grad_v;
  std::vector<std::string> kernels;  // launched by the forward and the backward
};

// The forward and the backward through kernels(kCuda), with q, k, v, grad_out
// in `dtype`; the backward takes `saved_out` and `saved_lse` where given (the
// CUDA-core run gets the tensor-core forward's, so both backwards see the
// same inputs).
Results run_device(const Inputs& inputs, DType dtype, const Tensor* saved_out = nullptr,
                   const Tensor* saved_lse = nullptr) {
  const auto on = [&](const Tensor& t) { return ops::to(ops::to(t, dtype), kCuda); };
  const Tensor q = on(inputs.q), k = on(inputs.k), v = on(inputs.v), grad_out = on(inputs.grad_out);
  const Shape& shape = inputs.q.sizes();
  const TensorOptions options{.dtype = dtype, .device = kCuda};
  const Tensor out = ops::empty(shape, options), grad_q = ops::empty(shape, options),
               grad_k = ops::empty(shape, options), grad_v = ops::empty(shape, options);
  const Tensor lse = ops::empty({shape[0], shape[1], shape[2]}, {.dtype = DType::f32, .device = kCuda});
  Results results;
  results.kernels = launched_kernels([&] {
    kernels(kCuda).causal_attention(out, lse, q, k, v);
    kernels(kCuda).causal_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v,
                                             saved_out ? on(*saved_out) : out, saved_lse ? *saved_lse : lse);
  });
  results.out = values_of(out);
  results.logsumexp = values_of(lse);
  results.grad_q = values_of(grad_q);
  results.grad_k = values_of(grad_k);
  results.grad_v = values_of(grad_v);
  return results;
}

// The f64 reference on the bf16 inputs, and per element the magnitudes the
// bound is made of (see check_within). The backward's delta = dO . out takes
// `device_out`, the out the kernels' backward was given.
struct Reference {
  std::vector<double> out, logsumexp, grad_q, grad_k, grad_v;
  std::vector<double> out_cast, out_slack, lse_bound, dq_cast, dq_slack, dk_cast, dk_slack, dv_cast, dv_slack;
};

Reference reference(const Inputs& inputs, const std::vector<double>& device_out) {
  const int64_t heads = inputs.q.size(0) * inputs.q.size(1), seq = inputs.q.size(2), dim = inputs.q.size(3);
  const std::vector<double> q = values_of(inputs.q), k = values_of(inputs.k), v = values_of(inputs.v),
                            go = values_of(inputs.grad_out);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const size_t n = q.size();
  Reference r;
  for (auto* vector : {&r.out, &r.grad_q, &r.grad_k, &r.grad_v, &r.out_cast, &r.out_slack, &r.dq_cast, &r.dq_slack,
                       &r.dk_cast, &r.dk_slack, &r.dv_cast, &r.dv_slack}) {
    vector->assign(n, 0.0);
  }
  r.logsumexp.assign(static_cast<size_t>(heads * seq), 0.0);
  r.lse_bound.assign(static_cast<size_t>(heads * seq), 0.0);
  // f32 chains: (D / 16) chained mma.m16n8k16 lose at most 17 2^-23 of the
  // sum of |terms| each (mma.h), so a score is within ((D/16) 17 + 1) 2^-23
  // scale sum_d |q k|.
  const double score_units = static_cast<double>(dim / 16 * 17 + 1);
  std::vector<double> p(static_cast<size_t>(seq)), magnitude(static_cast<size_t>(seq));
  for (int64_t h = 0; h < heads; ++h) {
    const auto at = [&](int64_t t, int64_t d) { return static_cast<size_t>((h * seq + t) * dim + d); };
    for (int64_t i = 0; i < seq; ++i) {
      double max_score = -INFINITY, max_magnitude = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0, m = 0;
        for (int64_t d = 0; d < dim; ++d) {
          s += q[at(i, d)] * k[at(j, d)];
          m += std::fabs(q[at(i, d)] * k[at(j, d)]);
        }
        p[j] = s * scale;
        magnitude[j] = m * scale;
        max_score = std::max(max_score, p[j]);
        max_magnitude = std::max(max_magnitude, magnitude[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[j] - max_score);
      const double lse = max_score + std::log(sum);
      r.logsumexp[h * seq + i] = lse;
      // lse in f32: the scores' error, T exp and sum roundings, log and add.
      r.lse_bound[h * seq + i] =
          2 * (score_units * max_magnitude + 2 + static_cast<double>(seq) / 2 + 2 * std::fabs(lse)) * 0x1p-23;
      for (int64_t j = 0; j <= i; ++j) p[j] = std::exp(p[j] - lse);
      double delta = 0;
      for (int64_t d = 0; d < dim; ++d) {
        double o = 0, cast = 0;
        for (int64_t j = 0; j <= i; ++j) {
          o += p[j] * v[at(j, d)];
          cast += p[j] * std::fabs(v[at(j, d)]);
        }
        r.out[at(i, d)] = o;
        r.out_cast[at(i, d)] = cast;
        r.out_slack[at(i, d)] = (1 + max_magnitude) * cast;
        delta += go[at(i, d)] * device_out[at(i, d)];
      }
      for (int64_t j = 0; j <= i; ++j) {
        double dp = 0, rows = 0;
        for (int64_t d = 0; d < dim; ++d) {
          dp += go[at(i, d)] * v[at(j, d)];
          rows += std::fabs(go[at(i, d)]) * (std::fabs(v[at(j, d)]) + std::fabs(device_out[at(i, d)]));
        }
        const double ds = p[j] * (dp - delta);
        // ds's f32 error: p's (relative, from the score and lse) times
        // |dp - delta|, and dp's and delta's sums.
        const double ds_slack = p[j] * ((1 + magnitude[j]) * std::fabs(dp - delta) + rows);
        for (int64_t d = 0; d < dim; ++d) {
          r.grad_v[at(j, d)] += p[j] * go[at(i, d)];
          r.dv_cast[at(j, d)] += p[j] * std::fabs(go[at(i, d)]);
          r.dv_slack[at(j, d)] += p[j] * (1 + magnitude[j]) * std::fabs(go[at(i, d)]);
          r.grad_k[at(j, d)] += scale * ds * q[at(i, d)];
          r.dk_cast[at(j, d)] += scale * std::fabs(ds * q[at(i, d)]);
          r.dk_slack[at(j, d)] += scale * ds_slack * std::fabs(q[at(i, d)]);
          r.grad_q[at(i, d)] += scale * ds * k[at(j, d)];
          r.dq_cast[at(i, d)] += scale * std::fabs(ds * k[at(j, d)]);
          r.dq_slack[at(i, d)] += scale * ds_slack * std::fabs(k[at(j, d)]);
        }
      }
    }
  }
  return r;
}

// The bound. The kernels round P (and dS) to bf16 once, as mma's A operand:
// each within 2^-8 of itself (bf16's unit roundoff), so an output
// sum_j p_j x_j moves by at most 2^-8 sum_j |p_j| |x_j| (`cast`: sum p |v|
// for out, sum p |dO| for dv, scale sum |ds| |q| for dk, scale sum |ds| |k|
// for dq); the result is rounded to bf16 once more, 2^-8 |value|. Every
// other step is f32: scores and dP from D/16 chained mma (at most
// (D/16) 17 2^-23 relative to the sum of |terms|, mma.h), the statistics, exp
// (2 ulp on a GPU), delta, and the T-long output sums; each stays below
// 2^-14 of the magnitude it is relative to at D <= 128 and T <= 256 (136 and
// 2 T + 8 units of 2^-23), and `slack` gathers those magnitudes (p's relative
// error grows with the score's scale sum |q k|, hence its 1 + magnitude
// factor). The bound takes 2^-12 of it: 4x margin on the f32 part.
//   |device - f64| <= 2^-8 (cast + |ref|) + 2^-12 slack
// Against the CUDA-core kernel in f32 (no bf16 cast, no final rounding, f32
// errors of the same kind) the two bounds add: the f32 part doubles.
void check_within(const char* what, const std::vector<double>& device, const std::vector<double>& ref,
                  const std::vector<double>& cast, const std::vector<double>& slack, double f32_parts,
                  double* worst_ratio) {
  CAPTURE(std::string(what));
  REQUIRE(device.size() == ref.size());
  int outside = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double bound = 0x1p-8 * (cast[i] + std::fabs(ref[i])) + f32_parts * 0x1p-12 * slack[i];
    const double error = std::fabs(device[i] - ref[i]);
    outside += !(error <= bound);
    worst = std::max(worst, error / bound);
  }
  CAPTURE(worst);
  CHECK(outside == 0);
  *worst_ratio = std::max(*worst_ratio, worst);
}

void check_lse(const std::vector<double>& device, const std::vector<double>& ref, const std::vector<double>& bound,
               double factor, double* worst_ratio) {
  int outside = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double error = std::fabs(device[i] - ref[i]);
    outside += !(error <= factor * bound[i]);
    worst = std::max(worst, error / (factor * bound[i]));
  }
  CAPTURE(worst);
  CHECK(outside == 0);
  *worst_ratio = std::max(*worst_ratio, worst);
}

struct Worst {
  double against_f64 = 0, against_cuda_cores = 0;
};

// The tensor-core run against the f64 reference and against the CUDA-core
// kernel (f32 on the widened inputs, its backward given the tensor-core
// forward's out and logsumexp).
void check_shape(const Shape& shape, uint64_t seed, Worst* worst) {
  CAPTURE(fmt::format("{}", shape));
  const Inputs inputs = make_inputs(shape, seed);
  const Results mma = run_device(inputs, DType::bf16);
#if TESSERA_HAVE_CUDA_SIM
  CHECK(launches(mma.kernels, "attention_mma_forward_kernel"));
  CHECK(launches(mma.kernels, "attention_mma_key_grads_kernel"));
  CHECK(launches(mma.kernels, "attention_mma_query_grads_kernel"));
  CHECK_FALSE(launches(mma.kernels, "(attention_forward_kernel"));
#endif
  const Tensor device_out = ops::from_vector(mma.out, shape, {.dtype = DType::f32});
  const Tensor device_lse =
      ops::to(ops::from_vector(mma.logsumexp, {shape[0], shape[1], shape[2]}, {.dtype = DType::f32}), kCuda);
  const Results cores = run_device(inputs, DType::f32, &device_out, &device_lse);
  const Reference ref = reference(inputs, mma.out);

  check_lse(mma.logsumexp, ref.logsumexp, ref.lse_bound, 1.0, &worst->against_f64);
  check_within("out", mma.out, ref.out, ref.out_cast, ref.out_slack, 1.0, &worst->against_f64);
  check_within("grad_q", mma.grad_q, ref.grad_q, ref.dq_cast, ref.dq_slack, 1.0, &worst->against_f64);
  check_within("grad_k", mma.grad_k, ref.grad_k, ref.dk_cast, ref.dk_slack, 1.0, &worst->against_f64);
  check_within("grad_v", mma.grad_v, ref.grad_v, ref.dv_cast, ref.dv_slack, 1.0, &worst->against_f64);

  check_lse(mma.logsumexp, cores.logsumexp, ref.lse_bound, 2.0, &worst->against_cuda_cores);
  check_within("out vs cuda cores", mma.out, cores.out, ref.out_cast, ref.out_slack, 2.0, &worst->against_cuda_cores);
  check_within("grad_q vs cuda cores", mma.grad_q, cores.grad_q, ref.dq_cast, ref.dq_slack, 2.0,
               &worst->against_cuda_cores);
  check_within("grad_k vs cuda cores", mma.grad_k, cores.grad_k, ref.dk_cast, ref.dk_slack, 2.0,
               &worst->against_cuda_cores);
  check_within("grad_v vs cuda cores", mma.grad_v, cores.grad_v, ref.dv_cast, ref.dv_slack, 2.0,
               &worst->against_cuda_cores);
}

// Sequence lengths around the 64-row tiles: one row, a partial tile (odd), an
// exact tile, one past, and three tiles with an odd tail; B * H from 1 to 6.
const Shape kShapes[] = {{2, 3, 1, 0}, {1, 2, 37, 0}, {1, 1, 64, 0}, {2, 1, 65, 0}, {1, 1, 131, 0}};

void check_head_dim(int64_t dim) {
  Worst worst;
  uint64_t seed = 100 + static_cast<uint64_t>(dim);
  for (Shape shape : kShapes) {
    shape[3] = dim;
    check_shape(shape, seed++, &worst);
  }
  MESSAGE("head dim ", dim, ": worst error / bound against f64 ", worst.against_f64, ", against the CUDA-core kernel ",
          worst.against_cuda_cores);
}

}  // namespace

TEST_CASE("attention on tensor cores, head dim 64: out, logsumexp and gradients within the bf16 bound") {
  check_head_dim(64);
}

TEST_CASE("attention on tensor cores, head dim 128: out, logsumexp and gradients within the bf16 bound") {
  check_head_dim(128);
}

namespace {

// q, k and v as the model makes them: [B, H, T, D] views into one packed
// [B, T, 3 H D + extra] projection starting `offset` elements in.
struct PackedHeads {
  Tensor q, k, v;
};

PackedHeads packed_heads(const Shape& shape, int64_t offset, uint64_t seed) {
  const int64_t batch = shape[0], heads = shape[1], seq = shape[2], dim = shape[3], width = heads * dim;
  const Tensor packed =
      ops::to(ops::to(ops::randn({batch, seq, 3 * width + offset}, PhiloxKey{seed, 1}), DType::bf16), kCuda);
  PackedHeads result;
  Tensor* slices[] = {&result.q, &result.k, &result.v};
  for (int64_t i = 0; i < 3; ++i) {
    *slices[i] =
        ops::transpose(ops::view(ops::narrow(packed, 2, offset + i * width, width), {batch, seq, heads, dim}), 1, 2);
  }
  return result;
}

Inputs on_cpu(const PackedHeads& heads, const Tensor& grad_out) {
  const auto dense = [](const Tensor& t) { return ops::contiguous(ops::to(t, kCPU)); };
  return {dense(heads.q), dense(heads.k), dense(heads.v), dense(grad_out)};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = ops::contiguous(ops::to(a, kCPU)), y = ops::contiguous(ops::to(b, kCPU));
  return x.sizes() == y.sizes() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0;
}

// The differentiable API's forward and backward on `heads`, checked against
// the f64 reference; returns the kernels launched.
std::vector<std::string> check_packed(const PackedHeads& heads, uint64_t seed, Worst* worst,
                                      ops::AttentionOutput* out = nullptr, ops::AttentionGrads* grads = nullptr) {
  const Tensor grad_out = ops::to(ops::to(ops::randn(heads.q.sizes(), PhiloxKey{seed, 2}), DType::bf16), kCuda);
  ops::AttentionOutput forward;
  ops::AttentionGrads backward;
  const std::vector<std::string> names = launched_kernels([&] {
    forward = ops::causal_attention(heads.q, heads.k, heads.v);
    backward = ops::causal_attention_backward(grad_out, heads.q, heads.k, heads.v, forward.out, forward.logsumexp);
  });
  const std::vector<double> device_out = values_of(forward.out);
  const Reference ref = reference(on_cpu(heads, grad_out), device_out);
  check_lse(values_of(forward.logsumexp), ref.logsumexp, ref.lse_bound, 1.0, &worst->against_f64);
  check_within("out", device_out, ref.out, ref.out_cast, ref.out_slack, 1.0, &worst->against_f64);
  check_within("grad_q", values_of(backward.q), ref.grad_q, ref.dq_cast, ref.dq_slack, 1.0, &worst->against_f64);
  check_within("grad_k", values_of(backward.k), ref.grad_k, ref.dk_cast, ref.dk_slack, 1.0, &worst->against_f64);
  check_within("grad_v", values_of(backward.v), ref.grad_v, ref.dv_cast, ref.dv_slack, 1.0, &worst->against_f64);
  if (out) *out = forward;
  if (grads) *grads = backward;
  return names;
}

}  // namespace

TEST_CASE("attention on tensor cores takes the model's strided heads: packed q, k, v and a [B, T, H, D] out") {
  for (const int64_t dim : {64, 128}) {
    CAPTURE(dim);
    const PackedHeads heads = packed_heads({2, 2, 45, dim}, 0, 200 + static_cast<uint64_t>(dim));
    CHECK_FALSE(ops::contiguous(heads.q).is_same(heads.q));
    Worst worst;
    ops::AttentionOutput strided;
    ops::AttentionGrads strided_grads;
    const std::vector<std::string> names = check_packed(heads, 201, &worst, &strided, &strided_grads);
#if TESSERA_HAVE_CUDA_SIM
    CHECK(launches(names, "attention_mma_forward_kernel"));
    CHECK(launches(names, "attention_mma_key_grads_kernel"));
    CHECK(launches(names, "attention_mma_query_grads_kernel"));
#endif
    CHECK(ops::transpose(strided.out, 1, 2).is_contiguous());  // merging the heads back is a view
    // Dense copies of the same heads: the same kernels, the same bits.
    const Tensor grad_out = ops::to(ops::to(ops::randn(heads.q.sizes(), PhiloxKey{201, 2}), DType::bf16), kCuda);
    const Tensor q = ops::contiguous(heads.q), k = ops::contiguous(heads.k), v = ops::contiguous(heads.v);
    const ops::AttentionOutput dense = ops::causal_attention(q, k, v);
    const ops::AttentionGrads dense_grads =
        ops::causal_attention_backward(ops::contiguous(grad_out), q, k, v, dense.out, dense.logsumexp);
    CHECK(same_bits(strided.out, dense.out));
    CHECK(same_bits(strided.logsumexp, dense.logsumexp));
    CHECK(same_bits(strided_grads.q, dense_grads.q));
    CHECK(same_bits(strided_grads.k, dense_grads.k));
    CHECK(same_bits(strided_grads.v, dense_grads.v));
    MESSAGE("strided heads, head dim ", dim, ": worst error / bound against f64 ", worst.against_f64);
  }
}

namespace {

// Sets the score budget for a scope (the default back at its end).
struct ScoreBudget {
  explicit ScoreBudget(int64_t bytes) { cuda::set_attention_score_grads_budget(bytes); }
  ~ScoreBudget() { cuda::set_attention_score_grads_budget(cuda::kDefaultScoreGradsBudget); }
};

}  // namespace

TEST_CASE("attention on tensor cores past the score budget: dQ recomputes dS in O(T) memory, the same values") {
  // T = 4096: 2080 causal tiles of 8 KiB, 17 MB a head; GPT-2 at B = 64, T = 1024: 0.8 GB, within 1 GiB.
  CHECK(cuda::attention_hands_over_scores({.heads = 768, .heads_per_batch = 12, .seq = 1024, .dim = 64}));
  CHECK(cuda::attention_score_grads_elements({.heads = 1, .heads_per_batch = 1, .seq = 4096, .dim = 64}) * 2 ==
        2080 * 8192);
  CHECK_FALSE(cuda::attention_hands_over_scores({.heads = 96, .heads_per_batch = 12, .seq = 4096, .dim = 64}));
  CHECK_THROWS_WITH_AS(cuda::set_attention_score_grads_budget(-1),
                       "cuda::set_attention_score_grads_budget: bytes must be >= 0, got -1", Error);
  for (const int64_t dim : {64, 128}) {
    CAPTURE(dim);
    const PackedHeads heads = packed_heads({2, 2, 45, dim}, 0, 210 + static_cast<uint64_t>(dim));
    Worst worst;
    ops::AttentionGrads handed, recomputed;
    const std::vector<std::string> handed_names = check_packed(heads, 211, &worst, nullptr, &handed);
    std::vector<std::string> recomputed_names;
    {
      const ScoreBudget none(0);
      recomputed_names = check_packed(heads, 211, &worst, nullptr, &recomputed);
    }
#if TESSERA_HAVE_CUDA_SIM
    CHECK(launches(handed_names, "attention_mma_query_grads_kernel"));
    CHECK_FALSE(launches(handed_names, "attention_mma_query_grads_recompute_kernel"));
    CHECK(launches(recomputed_names, "attention_mma_query_grads_recompute_kernel"));
    CHECK_FALSE(launches(recomputed_names, "attention_mma_query_grads_kernel"));
    // The simulator's mma adds a product's terms in one order whichever
    // operand holds the keys, so S^T is S transposed bit for bit and both
    // paths feed dQ's mma the same bf16 dS.
    CHECK(same_bits(recomputed.q, handed.q));
#endif
    // dK and dV come from the same kernel either way (it only skips the stores).
    CHECK(same_bits(recomputed.k, handed.k));
    CHECK(same_bits(recomputed.v, handed.v));
    MESSAGE("both dQ paths, head dim ", dim, ": worst error / bound against f64 ", worst.against_f64);
  }
}

TEST_CASE("attention that tensor cores do not take stays on CUDA cores: unaligned views, other head dims, f32") {
  Worst worst;
  // Views 4 elements (8 bytes) into the projection: rows are not 16-byte aligned.
  const std::vector<std::string> unaligned = check_packed(packed_heads({1, 2, 21, 64}, 4, 300), 301, &worst);
  // Head dim 80 in bf16 (the CUDA-core kernel's 128-wide variant).
  const std::vector<std::string> other_dim = check_packed(packed_heads({1, 1, 21, 80}, 0, 302), 303, &worst);
#if TESSERA_HAVE_CUDA_SIM
  for (const auto* names : {&unaligned, &other_dim}) {
    CHECK(launches(*names, "(attention_forward_kernel"));
    CHECK(launches(*names, "(attention_key_grads_kernel"));
    CHECK(launches(*names, "(attention_query_grads_kernel"));
    CHECK_FALSE(launches(*names, "attention_mma"));
  }
  const Tensor x = ops::zeros({1, 1, 8, 64}, {.dtype = DType::f32, .device = kCuda});
  const std::vector<std::string> f32 = launched_kernels([&] { (void)ops::causal_attention(x, x, x); });
  CHECK(launches(f32, "(attention_forward_kernel"));
  CHECK_FALSE(launches(f32, "attention_mma"));
#endif
  CHECK(cuda::attention_tiling(DType::bf16, 64).owned_rows == cuda::kAttentionMmaTile);
  CHECK(cuda::attention_tiling(DType::bf16, 128).streamed_rows == cuda::kAttentionMmaTile);
  CHECK(cuda::attention_tiling(DType::bf16, 80).owned_rows != cuda::kAttentionMmaTile);
  // Above the largest head dim: an error naming it, before any kernel.
  const Tensor wide = ops::zeros({1, 1, 4, 256}, {.dtype = DType::bf16, .device = kCuda});
  CHECK_THROWS_WITH_AS(ops::causal_attention(wide, wide, wide),
                       doctest::Contains("causal_attention: head dim 256 is above the 128"), Error);
}

TEST_CASE("attention on tensor cores gives the same bits in any block order") {
  const Inputs inputs = make_inputs({1, 2, 130, 64}, 400);
  const Results first = run_device(inputs, DType::bf16);
  for (const uint64_t seed : {3, 4}) {
#if TESSERA_HAVE_CUDA_SIM
    cuda::sim::set_block_order_seed(seed);
#else
    (void)seed;
#endif
    const Results again = run_device(inputs, DType::bf16);
    CHECK(again.out == first.out);
    CHECK(again.logsumexp == first.logsumexp);
    CHECK(again.grad_q == first.grad_q);
    CHECK(again.grad_k == first.grad_k);
    CHECK(again.grad_v == first.grad_v);
  }
}

#if TESSERA_SIM_CHECKS
namespace {

// What the simulator counted for `run`, summed over its kernels.
cuda::sim::KernelCounters counted(const std::function<void()>& run) {
  current_stream(kCuda)->synchronize();
  cuda::sim::reset_kernel_counters();
  run();
  current_stream(kCuda)->synchronize();
  cuda::sim::KernelCounters total;
  for (const auto& [name, counter] : cuda::sim::kernel_counters()) {
    total.device_bytes_read += counter.device_bytes_read;
    total.device_bytes_written += counter.device_bytes_written;
    total.shared_bytes_accessed += counter.shared_bytes_accessed;
    total.flops += counter.flops;
  }
  return total;
}

struct Launched {
  cuda::sim::KernelCounters forward, backward;
};

Launched count_launches(const Shape& shape, DType dtype) {
  const Inputs inputs = make_inputs(shape, 500);
  const auto on = [&](const Tensor& t) { return ops::to(ops::to(t, dtype), kCuda); };
  const Tensor q = on(inputs.q), k = on(inputs.k), v = on(inputs.v), grad_out = on(inputs.grad_out);
  const TensorOptions options{.dtype = dtype, .device = kCuda};
  const Tensor out = ops::empty(shape, options), grad_q = ops::empty(shape, options),
               grad_k = ops::empty(shape, options), grad_v = ops::empty(shape, options);
  const Tensor lse = ops::empty({shape[0], shape[1], shape[2]}, {.dtype = DType::f32, .device = kCuda});
  Launched launched;
  launched.forward = counted([&] { kernels(kCuda).causal_attention(out, lse, q, k, v); });
  launched.backward = counted(
      [&] { kernels(kCuda).causal_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse); });
  return launched;
}

}  // namespace

TEST_CASE("attention on tensor cores moves the tiling's device bytes") {
  for (const Shape& shape : {Shape{1, 2, 130, 64}, Shape{2, 1, 70, 128}}) {
    CAPTURE(fmt::format("{}", shape));
    const int64_t heads = shape[0] * shape[1], seq = shape[2], row = shape[3] * 2, acc = 4;
    const int64_t tile = cuda::kAttentionMmaTile;
    // A block owning rows [first, first + 64) streams the other side in
    // whole tiles cut at T: keys up to its last query (forward, dQ), queries
    // from its first key to T (dK, dV).
    int64_t keys_streamed = 0, queries_streamed = 0;
    for (int64_t first = 0; first < seq; first += tile) {
      keys_streamed += std::min(seq, first + tile);
      queries_streamed += seq - first;
    }
    // The causal 64 x 64 tiles of bf16 dS, each written whole by dK/dV and
    // read whole by dQ.
    const int64_t tiles = (seq + tile - 1) / tile;
    const int64_t score_grads = tiles * (tiles + 1) / 2 * tile * tile * 2;
    // forward: q, out and logsumexp once, k and v per query tile;
    // delta: grad_out and out once, delta written;
    // dK/dV: k, v, grad_k, grad_v once, q, grad_out, lse, delta per key tile, dS written;
    // dQ: grad_q once, k per query tile, dS read.
    const int64_t forward = heads * (2 * seq * row + seq * acc + 2 * keys_streamed * row);
    const int64_t backward =
        heads * ((2 * seq * row + seq * acc) +
                 (4 * seq * row + queries_streamed * (2 * row + 2 * acc) + score_grads) +
                 (seq * row + keys_streamed * row + score_grads));
    const Launched launched = count_launches(shape, DType::bf16);
    CHECK(launched.forward.device_bytes_read + launched.forward.device_bytes_written == forward);
    CHECK(launched.backward.device_bytes_read + launched.backward.device_bytes_written == backward);
  }
}

TEST_CASE("attention on tensor cores reads at least 5x fewer shared bytes per (query, key) pair than on CUDA cores") {
  // T = 256, D = 64: 256 * 257 / 2 visible pairs. The CUDA-core kernel
  // stages bf16 widened to f32, so its f32 run moves the same shared bytes.
  const Shape shape{1, 1, 256, 64};
  const double pairs = 256.0 * 257.0 / 2.0;
  const Launched mma = count_launches(shape, DType::bf16), cores = count_launches(shape, DType::f32);
  const double mma_forward = static_cast<double>(mma.forward.shared_bytes_accessed) / pairs;
  const double mma_backward = static_cast<double>(mma.backward.shared_bytes_accessed) / pairs;
  const double cores_forward = static_cast<double>(cores.forward.shared_bytes_accessed) / pairs;
  const double cores_backward = static_cast<double>(cores.backward.shared_bytes_accessed) / pairs;
  MESSAGE("shared bytes per visible pair at T = 256, D = 64: forward ", mma_forward, " on tensor cores, ",
          cores_forward, " on CUDA cores; backward ", mma_backward, " and ", cores_backward);
  CHECK(cores_forward >= 5 * mma_forward);
  CHECK(cores_backward >= 5 * mma_backward);
  // Tensor-core FLOPs (every warp-wide mma counts 4096): the useful work is
  // 4 D per visible pair forward (Q K^T and P V) and 10 D backward (S, dP,
  // dV, dK, dQ: dQ's kernel reads dS instead of recomputing S and dP);
  // masked halves of the diagonal steps add some (1.06x forward, 1.21x
  // backward at T = 256: its warps skip less of the diagonal).
  const double useful_forward = 4.0 * 64 * pairs, useful_backward = 10.0 * 64 * pairs;
  MESSAGE("mma FLOPs over the useful work: forward ", static_cast<double>(mma.forward.flops) / useful_forward,
          ", backward ", static_cast<double>(mma.backward.flops) / useful_backward);
  CHECK(static_cast<double>(mma.forward.flops) >= useful_forward);
  CHECK(static_cast<double>(mma.forward.flops) <= 1.1 * useful_forward);
  CHECK(static_cast<double>(mma.backward.flops) >= useful_backward);
  CHECK(static_cast<double>(mma.backward.flops) <= 1.3 * useful_backward);
  CHECK(cores.forward.flops == 0);  // CUDA-core arithmetic is not counted
}
#endif

TEST_CASE("the model's attention in bf16 runs on tensor cores: split projection, heads as views, autograd") {
  const int64_t batch = 2, heads = 2, seq = 33, dim = 64, width = heads * dim;
  const Tensor projection =
      ops::to(ops::to(ops::randn({batch, seq, 3 * width}, PhiloxKey{600, 1}), DType::bf16), kCuda);
  const Tensor grad_y = ops::to(ops::to(ops::randn({batch, seq, width}, PhiloxKey{600, 2}), DType::bf16), kCuda);
  Tensor packed = ops::clone(projection);
  packed.set_requires_grad(true);
  std::vector<Tensor> views;
  for (Tensor& part : tessera::split(packed, width, 2)) {
    views.push_back(tessera::transpose(tessera::view(part, {batch, seq, heads, dim}), 1, 2));
  }
  const std::vector<std::string> names = launched_kernels([&] {
    const Tensor y = tessera::scaled_dot_product_attention(views[0], views[1], views[2]);
    autograd::backward(tessera::reshape(tessera::transpose(y, 1, 2), {batch, seq, width}), grad_y);
  });
#if TESSERA_HAVE_CUDA_SIM
  CHECK(launches(names, "attention_mma_forward_kernel"));
  CHECK(launches(names, "attention_mma_key_grads_kernel"));
  CHECK(launches(names, "attention_mma_query_grads_kernel"));
  CHECK_FALSE(launches(names, "(attention_forward_kernel"));
#endif
  // The same gradients as the kernels give on the heads directly, packed as the projection.
  const PackedHeads direct = packed_heads({batch, heads, seq, dim}, 0, 600);
  const ops::AttentionOutput forward = ops::causal_attention(direct.q, direct.k, direct.v);
  const Tensor grad_out = ops::transpose(ops::view(grad_y, {batch, seq, heads, dim}), 1, 2);
  const ops::AttentionGrads grads =
      ops::causal_attention_backward(grad_out, direct.q, direct.k, direct.v, forward.out, forward.logsumexp);
  const Tensor grad = packed.grad();
  CHECK(same_bits(ops::narrow(grad, 2, 0, width), ops::reshape(ops::transpose(grads.q, 1, 2), {batch, seq, width})));
  CHECK(same_bits(ops::narrow(grad, 2, width, width),
                  ops::reshape(ops::transpose(grads.k, 1, 2), {batch, seq, width})));
  CHECK(same_bits(ops::narrow(grad, 2, 2 * width, width),
                  ops::reshape(ops::transpose(grads.v, 1, 2), {batch, seq, width})));
}
