// Causal attention on the cuda device (tensor/cuda/attention.cu) against the
// cpu kernel (tensor/cpu/attention.cpp): forward (out, logsumexp) and
// backward (dq, dk, dv) over sequence lengths around the 32-row tiles, head
// dims of every kernel variant, f32, f64 and bf16; the backward's bits on
// every run; strided heads (views of a packed projection, the [B, T, H, D]
// order) against contiguous ones, and the packed gradients; the errors; the bytes the tiling moves and the memory it
// allocates (simulator); a gradcheck through the differentiable API.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "tensor/cuda/attention.h"
#include "tensor/cuda/caching_allocator.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/launch.h"
#endif
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/stream.h"

using namespace tessera;

namespace {

const Device kCuda(DeviceType::cuda);

struct Inputs {
  Tensor q, k, v, grad_out;  // [B, H, T, D] on cpu
};

struct Results {
  Tensor out, logsumexp, grad_q, grad_k, grad_v;  // on cpu
};

// Values in N(0, 1), rounded to `dtype`.
Inputs make_inputs(const Shape& shape, DType dtype, uint64_t seed) {
  const auto draw = [&](uint64_t stream) { return ops::to(ops::randn(shape, PhiloxKey{seed, stream}), dtype); };
  return {draw(1), draw(2), draw(3), draw(4)};
}

Tensor on(const Tensor& tensor, Device device, DType dtype) { return ops::to(ops::to(tensor, dtype), device); }

// The forward and the backward through kernels(device) directly, with q, k,
// v, out and the gradients in `dtype` and logsumexp in `accumulation`. The
// backward takes the forward's out and logsumexp, or `saved`'s when given.
Results run(Device device, DType dtype, DType accumulation, const Inputs& inputs,
            const Results* saved = nullptr) {
  const Tensor q = on(inputs.q, device, dtype), k = on(inputs.k, device, dtype), v = on(inputs.v, device, dtype);
  const Tensor grad_out = on(inputs.grad_out, device, dtype);
  const Shape& shape = inputs.q.sizes();
  const auto empty = [&](const Shape& sizes, DType type) { return ops::empty(sizes, {.dtype = type, .device = device}); };
  Results results{empty(shape, dtype), empty({shape[0], shape[1], shape[2]}, accumulation), empty(shape, dtype),
                  empty(shape, dtype), empty(shape, dtype)};
  kernels(device).causal_attention(results.out, results.logsumexp, q, k, v);
  const Tensor out = saved ? on(saved->out, device, dtype) : results.out;
  const Tensor logsumexp = saved ? on(saved->logsumexp, device, accumulation) : results.logsumexp;
  kernels(device).causal_attention_backward(results.grad_q, results.grad_k, results.grad_v, grad_out, q, k, v, out,
                                            logsumexp);
  for (Tensor* result : {&results.out, &results.logsumexp, &results.grad_q, &results.grad_k, &results.grad_v}) {
    *result = ops::to(*result, kCPU);
  }
  return results;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {  // dense cpu tensors
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.nbytes())) == 0;
}

double max_abs(const Tensor& x) { return ops::amax(ops::abs(ops::to(x, DType::f64)), {}).item(); }

// The device's result against the reference: both sum the same terms in
// different orders. A sum of n terms is within n u sum|terms| of the exact
// value (Higham's gamma_n), so the two differ by at most 2 n u sum|terms|.
// Every value here chains sums of at most D (a score, a row dot) and T (a
// softmax row, a column of P^T dO) terms, whose magnitudes the largest
// |reference| value bounds up to the O(1) factors of N(0, 1) inputs: the
// bound is 2 (D + T) u (1 + max |reference|). `rounding` adds the relative
// error of a final rounding (bf16). Measured: f32 within 0.12 of the bound
// (2.1e-6), f64 within 0.22 (3.1e-15), bf16 below it.
void check_close(const char* what, const Tensor& device, const Tensor& reference, double unit, int64_t seq,
                 int64_t dim, double rounding = 0.0) {
  const double magnitude = max_abs(reference);
  const double error = max_abs(ops::sub(ops::to(device, DType::f64), ops::to(reference, DType::f64)));
  const double bound = 2.0 * static_cast<double>(dim + seq) * unit * (1.0 + magnitude) + rounding * magnitude;
  CAPTURE(std::string(what));
  CAPTURE(error);
  CAPTURE(bound);
  CHECK(error <= bound);
}

constexpr double kF32Unit = 0x1p-24, kF64Unit = 0x1p-53, kBF16Unit = 0x1p-8;  // unit roundoffs

void check_against_cpu(const Shape& shape, DType dtype, uint64_t seed) {
  CAPTURE(fmt::format("{}", shape));
  CAPTURE(dtype_name(dtype));
  const int64_t seq = shape[2], dim = shape[3];
  const Inputs inputs = make_inputs(shape, dtype, seed);
  const DType accumulation = dtype == DType::f64 ? DType::f64 : DType::f32;
  // bf16: the cpu in f32 on the same rounded inputs, its backward on the
  // device's out (rounded to bf16: the backward's input) and logsumexp; the
  // device rounds its f32 results to bf16 once at the end (logsumexp stays f32).
  const Results device = run(kCuda, dtype, accumulation, inputs);
  const Results reference = run(kCPU, accumulation, accumulation, inputs, dtype == DType::bf16 ? &device : nullptr);
  const double unit = dtype == DType::f64 ? kF64Unit : kF32Unit;
  const double rounding = dtype == DType::bf16 ? kBF16Unit : 0.0;
  check_close("out", device.out, reference.out, unit, seq, dim, rounding);
  check_close("logsumexp", device.logsumexp, reference.logsumexp, unit, seq, dim);
  check_close("grad_q", device.grad_q, reference.grad_q, unit, seq, dim, rounding);
  check_close("grad_k", device.grad_k, reference.grad_k, unit, seq, dim, rounding);
  check_close("grad_v", device.grad_v, reference.grad_v, unit, seq, dim, rounding);
}

// Sequence lengths around the 32-row tiles: one row, a partial tile, exact
// tiles, one past, several tiles and a tail.
constexpr int64_t kSeqs[] = {1, 5, 63, 64, 65, 130};

// B * H from 1 to 6, smaller for the long sequences (simulator time).
Shape shape_for(int64_t seq, int64_t dim) {
  if (seq <= 5) return {2, 3, seq, dim};
  if (seq <= 65) return {1, 2, seq, dim};
  return {1, 1, seq, dim};
}

}  // namespace

TEST_CASE("causal attention on cuda matches the cpu in f32, head dim 16") {
  for (const int64_t seq : kSeqs) check_against_cpu(shape_for(seq, 16), DType::f32, 10 + seq);
}

TEST_CASE("causal attention on cuda matches the cpu in f32, head dim 64") {
  for (const int64_t seq : kSeqs) check_against_cpu(shape_for(seq, 64), DType::f32, 20 + seq);
}

TEST_CASE("causal attention on cuda matches the cpu in f32, head dim 80 and 128 (shared memory opt-in)") {
  for (const int64_t seq : kSeqs) check_against_cpu(shape_for(seq, 80), DType::f32, 30 + seq);
  check_against_cpu({1, 1, 65, 128}, DType::f32, 40);
}

TEST_CASE("causal attention on cuda matches the cpu in f64 (every tiling: 32, 64 and 128-wide heads)") {
  for (const int64_t dim : {16, 64, 80, 128}) {
    for (const int64_t seq : {1, 5, 65}) check_against_cpu(shape_for(seq, dim), DType::f64, 50 + seq + dim);
  }
}

TEST_CASE("causal attention on cuda in bf16 matches the cpu in f32 on the rounded inputs") {
  // bf16 at head dims 64 and 128 runs on tensor cores, whose P and dS round to
  // bf16 before their products: test_attention_mma.cpp holds it to a bound
  // with that rounding. Here, the CUDA-core kernel's f32-accurate bf16 path.
  for (const int64_t dim : {16, 80}) {
    for (const int64_t seq : {1, 5, 65}) check_against_cpu(shape_for(seq, dim), DType::bf16, 60 + seq + dim);
  }
}

TEST_CASE("causal attention's backward on cuda gives the same bits on every run") {
  const Inputs inputs = make_inputs({2, 2, 70, 16}, DType::f32, 70);
  const Results first = run(kCuda, DType::f32, DType::f32, inputs);
  for ([[maybe_unused]] uint64_t seed : {1, 2}) {  // the sim reorders blocks by it; a GPU runs twice
#if TESSERA_HAVE_CUDA_SIM
    cuda::sim::set_block_order_seed(seed);  // blocks in another order
#endif
    const Results again = run(kCuda, DType::f32, DType::f32, inputs);
    for (const auto& [a, b] : {std::pair{first.out, again.out}, std::pair{first.logsumexp, again.logsumexp},
                               std::pair{first.grad_q, again.grad_q}, std::pair{first.grad_k, again.grad_k},
                               std::pair{first.grad_v, again.grad_v}}) {
      CHECK(bitwise_equal(a, b));
    }
  }
}

namespace {

// q, k and v as the model makes them: [B, H, T, D] views into one packed
// [B, T, 3C] projection (the heads of each C-wide slice).
struct PackedHeads {
  Tensor packed, q, k, v;
};

PackedHeads packed_heads(int64_t batch, int64_t heads, int64_t seq, int64_t dim, Device device, DType dtype) {
  const int64_t width = heads * dim;
  PackedHeads result;
  result.packed = on(ops::randn({batch, seq, 3 * width}, PhiloxKey{31, 1}), device, dtype);
  Tensor* slices[] = {&result.q, &result.k, &result.v};
  for (int64_t i = 0; i < 3; ++i) {
    *slices[i] = ops::transpose(ops::view(ops::narrow(result.packed, 2, i * width, width), {batch, seq, heads, dim}), 1, 2);
  }
  return result;
}

Tensor dense_on_cpu(const Tensor& t) { return ops::contiguous(ops::to(t, kCPU)); }

}  // namespace

TEST_CASE("causal attention takes strided heads: packed q, k, v and a [B, T, H, D] out give the contiguous bits") {
  for (const Device device : {kCPU, kCuda}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      if (device.is_cpu() && dtype == DType::bf16) continue;  // the cpu kernels compute f32, f64
      CAPTURE(device.str());
      CAPTURE(dtype_name(dtype));
      const PackedHeads heads = packed_heads(2, 3, 37, 16, device, dtype);
      const Tensor grad_out = on(ops::randn(heads.q.sizes(), PhiloxKey{31, 2}), device, dtype);
      const ops::AttentionOutput strided = ops::causal_attention(heads.q, heads.k, heads.v);
      const ops::AttentionOutput dense =
          ops::causal_attention(ops::contiguous(heads.q), ops::contiguous(heads.k), ops::contiguous(heads.v));
      CHECK_FALSE(ops::contiguous(heads.q).is_same(heads.q));
      CHECK(bitwise_equal(dense_on_cpu(strided.out), dense_on_cpu(dense.out)));
      CHECK(bitwise_equal(dense_on_cpu(strided.logsumexp), dense_on_cpu(dense.logsumexp)));
      // out is laid out [B, T, H, D]: merging the heads back is a view.
      CHECK(ops::transpose(strided.out, 1, 2).is_contiguous());

      const ops::AttentionGrads grads =
          ops::causal_attention_backward(grad_out, heads.q, heads.k, heads.v, strided.out, strided.logsumexp);
      const ops::AttentionGrads dense_grads =
          ops::causal_attention_backward(ops::contiguous(grad_out), ops::contiguous(heads.q), ops::contiguous(heads.k),
                                         ops::contiguous(heads.v), dense.out, dense.logsumexp);
      CHECK(bitwise_equal(dense_on_cpu(grads.q), dense_on_cpu(dense_grads.q)));
      CHECK(bitwise_equal(dense_on_cpu(grads.k), dense_on_cpu(dense_grads.k)));
      CHECK(bitwise_equal(dense_on_cpu(grads.v), dense_on_cpu(dense_grads.v)));
      // The gradients of packed inputs are packed the same way, in one new buffer.
      CHECK(grads.k.storage() == grads.q.storage());
      CHECK(grads.v.storage() == grads.q.storage());
      CHECK(grads.q.strides() == heads.q.strides());
      CHECK(grads.k.storage_offset() - grads.q.storage_offset() == heads.k.storage_offset() - heads.q.storage_offset());
      CHECK(grads.q.storage() != heads.packed.storage());
      // Unpacked inputs get [B, T, H, D]-ordered gradients of their own.
      CHECK(dense_grads.q.storage() != dense_grads.k.storage());
      CHECK(ops::transpose(dense_grads.q, 1, 2).is_contiguous());
      // Evenly spaced views of one buffer that overlap (each half a slice
      // after the last) are not a packed projection: separate gradients,
      // the same values.
      const int64_t width = 3 * 16;
      const auto heads_at = [&](int64_t offset) {
        return ops::transpose(ops::view(ops::narrow(heads.packed, 2, offset, width), {2, 37, 3, 16}), 1, 2);
      };
      const Tensor q = heads_at(0), k = heads_at(width / 2), v = heads_at(width);
      const ops::AttentionOutput shifted = ops::causal_attention(q, k, v);
      const ops::AttentionGrads shifted_grads =
          ops::causal_attention_backward(grad_out, q, k, v, shifted.out, shifted.logsumexp);
      CHECK(shifted_grads.q.storage() != shifted_grads.k.storage());
      const ops::AttentionGrads shifted_dense = ops::causal_attention_backward(
          grad_out, ops::contiguous(q), ops::contiguous(k), ops::contiguous(v), shifted.out, shifted.logsumexp);
      CHECK(bitwise_equal(dense_on_cpu(shifted_grads.q), dense_on_cpu(shifted_dense.q)));
      CHECK(bitwise_equal(dense_on_cpu(shifted_grads.k), dense_on_cpu(shifted_dense.k)));
    }
  }
}

TEST_CASE("the split's backward joins packed attention gradients as a view: the same gradient, no copy") {
  for (const Device device : {kCPU, kCuda}) {
    CAPTURE(device.str());
    const int64_t batch = 2, heads = 2, seq = 19, dim = 8, width = heads * dim;
    const Tensor packed_values = on(ops::randn({batch, seq, 3 * width}, PhiloxKey{32, 1}), device, DType::f32);
    const Tensor grad_y = on(ops::randn({batch, seq, width}, PhiloxKey{32, 2}), device, DType::f32);
    // y = the heads of attention over the packed slices, merged back to [B, T, C].
    const auto attention_grad = [&](bool through_copies) {
      Tensor packed = ops::clone(packed_values);
      packed.set_requires_grad(true);
      std::vector<Tensor> parts = tessera::split(packed, width, 2);
      std::vector<Tensor> views;
      for (Tensor& part : parts) {
        Tensor view = tessera::transpose(tessera::view(part, {batch, seq, heads, dim}), 1, 2);
        views.push_back(through_copies ? tessera::mul(view, 1.0) : view);
      }
      const Tensor y = tessera::scaled_dot_product_attention(views[0], views[1], views[2]);
      autograd::backward(tessera::reshape(tessera::transpose(y, 1, 2), {batch, seq, width}), grad_y);
      return packed.grad();
    };
    const Tensor joined = attention_grad(false), copied = attention_grad(true);
    CHECK(bitwise_equal(dense_on_cpu(joined), dense_on_cpu(copied)));
    CHECK(joined.is_contiguous());
#if TESSERA_SIM_CHECKS
    if (device.is_cuda()) {
      current_stream(kCuda)->synchronize();
      cuda::sim::reset_kernel_counters();
      (void)attention_grad(false);
      current_stream(kCuda)->synchronize();
      int64_t copies = 0;
      for (const auto& [name, counter] : cuda::sim::kernel_counters()) {
        if (name.find("copy") != std::string::npos) copies += counter.launches;
      }
      CHECK(copies == 1);  // the clone of the inputs; none in forward or backward
    }
#endif
  }
}

TEST_CASE("causal attention on cuda: errors name the op and the operands") {
  const auto tensor = [](const Shape& shape, DType dtype = DType::f32) {
    return ops::zeros(shape, {.dtype = dtype, .device = kCuda});
  };
  const Tensor x = tensor({1, 2, 4, 8}), lse = tensor({1, 2, 4});
  const auto forward = [](const Tensor& out, const Tensor& logsumexp, const Tensor& q, const Tensor& k,
                          const Tensor& v) { kernels(kCuda).causal_attention(out, logsumexp, q, k, v); };
  CHECK_THROWS_WITH_AS(forward(tensor({1, 1, 4, 256}), tensor({1, 1, 4}), tensor({1, 1, 4, 256}),
                               tensor({1, 1, 4, 256}), tensor({1, 1, 4, 256})),
                       doctest::Contains("cuda::causal_attention: head dim 256 is above the 128"), Error);
  CHECK_THROWS_WITH_AS(forward(x, lse, x, tensor({1, 2, 5, 8}), x),
                       doctest::Contains("cuda::causal_attention: k must be q's shape [1, 2, 4, 8], got [1, 2, 5, 8]"),
                       Error);
  CHECK_THROWS_WITH_AS(forward(x, lse, x, x, ops::transpose(tensor({1, 2, 8, 4}), 2, 3)),
                       doctest::Contains("cuda::causal_attention: v needs contiguous rows (a unit stride along D)"),
                       Error);
  CHECK_THROWS_WITH_AS(forward(x, lse, x, tensor({1, 2, 4, 8}, DType::f64), x),
                       doctest::Contains("cuda::causal_attention: k is f64, q is f32"), Error);
  CHECK_THROWS_WITH_AS(forward(tensor({1, 2, 4, 8}, DType::f16), lse, tensor({1, 2, 4, 8}, DType::f16),
                               tensor({1, 2, 4, 8}, DType::f16), tensor({1, 2, 4, 8}, DType::f16)),
                       doctest::Contains("cuda::causal_attention: computes f32, f64 or bf16"), Error);
  CHECK_THROWS_WITH_AS(forward(x, tensor({1, 2, 4}, DType::f64), x, x, x),
                       doctest::Contains("cuda::causal_attention: logsumexp must be f32 [1, 2, 4]"), Error);
  CHECK_THROWS_WITH_AS(forward(tensor({2, 4, 8}), tensor({2, 4}), tensor({2, 4, 8}), tensor({2, 4, 8}),
                               tensor({2, 4, 8})),
                       doctest::Contains("cuda::causal_attention: q must be [B, H, T, D], got [2, 4, 8]"), Error);
  CHECK_THROWS_WITH_AS(
      kernels(kCuda).causal_attention_backward(x, x, tensor({1, 2, 4, 7}), x, x, x, x, x, lse),
      doctest::Contains("cuda::causal_attention_backward: grad_v must be q's shape [1, 2, 4, 8], got [1, 2, 4, 7]"),
      Error);
  CHECK_THROWS_WITH_AS(kernels(kCuda).causal_attention_backward(x, x, x, x, x, x, x, x, tensor({1, 2, 4}, DType::bf16)),
                       doctest::Contains("cuda::causal_attention_backward: logsumexp must be f32"), Error);
}

#if TESSERA_SIM_CHECKS
TEST_CASE("causal attention on cuda moves the tiling's bytes and allocates O(T)") {
  for (const auto& [shape, dtype] : {std::pair{Shape{1, 2, 130, 16}, DType::f32}, std::pair{Shape{2, 1, 70, 64}, DType::f32},
                                     std::pair{Shape{1, 2, 65, 80}, DType::bf16}, std::pair{Shape{1, 1, 70, 128}, DType::f64}}) {
    CAPTURE(fmt::format("{}", shape));
    CAPTURE(dtype_name(dtype));
    const int64_t heads = shape[0] * shape[1], seq = shape[2], dim = shape[3];
    const DType accumulation = dtype == DType::f64 ? DType::f64 : DType::f32;
    const int64_t element = element_size(dtype), acc = element_size(accumulation);
    const cuda::AttentionTiling tiling = cuda::attention_tiling(dtype, dim);
    const int64_t owned = tiling.owned_rows, streamed = tiling.streamed_rows;
    // Rows of the streamed side a block owning rows [first, first + owned)
    // loads: forward and dQ stream keys up to its last query row (whole
    // tiles, cut at T); dK/dV stream queries from the tile holding its
    // first key to T.
    int64_t keys_streamed = 0, queries_streamed = 0;
    for (int64_t first = 0; first < seq; first += owned) {
      const int64_t keys_end = std::min(seq, first + owned);
      keys_streamed += std::min(seq, (keys_end + streamed - 1) / streamed * streamed);
      queries_streamed += seq - first / streamed * streamed;
    }
    const int64_t row = dim * element;
    // forward: q once, k and v per query tile, out and logsumexp once
    const int64_t forward = heads * (seq * row + 2 * keys_streamed * row + seq * row + seq * acc);
    // delta: grad_out and out once, delta written;
    // dK/dV: k, v once, q, grad_out, lse, delta per key tile, grad_k, grad_v once;
    // dQ: q, grad_out, lse, delta once, k, v per query tile, grad_q once.
    const int64_t backward = heads * ((2 * seq * row + seq * acc) +
                                      (4 * seq * row + queries_streamed * (2 * row + 2 * acc)) +
                                      (2 * seq * row + 2 * seq * acc + 2 * keys_streamed * row + seq * row));

    const Inputs inputs = make_inputs(shape, dtype, 80);
    const Tensor q = on(inputs.q, kCuda, dtype), k = on(inputs.k, kCuda, dtype), v = on(inputs.v, kCuda, dtype);
    const Tensor grad_out = on(inputs.grad_out, kCuda, dtype);
    const TensorOptions options{.dtype = dtype, .device = kCuda};
    const Tensor out = ops::empty(shape, options), grad_q = ops::empty(shape, options),
                 grad_k = ops::empty(shape, options), grad_v = ops::empty(shape, options);
    const Tensor lse = ops::empty({shape[0], shape[1], seq}, {.dtype = accumulation, .device = kCuda});
    const auto counted = [](auto run) {
      current_stream(kCuda)->synchronize();
      cuda::sim::reset_kernel_counters();
      run();
      current_stream(kCuda)->synchronize();
      int64_t bytes = 0;
      for (const auto& [name, counter] : cuda::sim::kernel_counters()) {
        bytes += counter.device_bytes_read + counter.device_bytes_written;
      }
      return bytes;
    };
    const int64_t forward_bytes = counted([&] { kernels(kCuda).causal_attention(out, lse, q, k, v); });
    cuda::CachingAllocator& allocator = cuda::CachingAllocator::of(0);
    const int64_t live = allocator.stats().allocated_bytes;
    allocator.reset_peak();
    const int64_t backward_bytes = counted([&] {
      kernels(kCuda).causal_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse);
    });
    // The one scratch is delta, [B, H, T] (rounded to 512-byte blocks); a
    // [T, T] buffer per head would be heads * T^2 * 4 bytes.
    const int64_t scratch = (heads * seq * acc + 511) / 512 * 512;
    CHECK(allocator.stats().peak_allocated_bytes - live <= scratch);
    CHECK(scratch < heads * seq * seq * acc);
    CHECK(forward_bytes == forward);
    CHECK(backward_bytes == backward);
  }
}
#endif

TEST_CASE("gradcheck of scaled_dot_product_attention on cuda, in f64") {
  const auto leaf = [](uint64_t stream) {
    Tensor values = ops::to(ops::randn({1, 2, 5, 3}, PhiloxKey{90, stream}, {.dtype = DType::f64}), kCuda);
    values.set_requires_grad(true);
    return values;
  };
  const autograd::GradcheckResult result = autograd::gradcheck(
      [](const autograd::TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
      {leaf(1), leaf(2), leaf(3)});
  CHECK_MESSAGE(result.ok, result.report);
}
