// GEMM benchmark: tessera's ops::matmul / ops::linear (on its GEMM backend) against a direct Eigen
// GEMM on the same operands, in f32, for square matrices and the GPT-2 124M
// layer shapes (B=4, T=64: 256 tokens, C=768) forward and backward, each also
// as a fraction of the machine's FMA peak measured in the same run.
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/machine_context.h"
#include "tensor/cpu/float_vector.h"
#include "tensor/gemm_backend.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace tessera;

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<const RowMatrix>;

// Seconds from the wall clock, or from this process's CPU clock (--cpu-time: on
// a machine shared with other work, single-threaded runs then count only the
// time they actually ran, page faults included).
bool use_cpu_clock = false;

double now_seconds() {
  if (use_cpu_clock) {
    timespec cpu{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    return static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best seconds per call of each function, timed alternately (so that load
// from other processes hits both alike): one warm-up each, then repeats until
// 1 s or 20 rounds (at least 5).
std::vector<double> best_seconds(const std::vector<std::function<void()>>& calls) {
  for (const auto& call : calls) call();
  std::vector<double> best(calls.size(), 1e30);
  double total = 0.0;
  for (int rep = 0; rep < 20 && (rep < 5 || total < 1.0); ++rep) {
    for (size_t i = 0; i < calls.size(); ++i) {
      const double start = now_seconds();
      calls[i]();
      const double seconds = now_seconds() - start;
      best[i] = std::min(best[i], seconds);
      total += seconds;
    }
  }
  return best;
}

// The FMA throughput of this build's vector ISA on `threads` cores, in
// GFLOP/s: independent chains of fused multiply-adds, enough of them to hide
// the FMA latency on every pipe, and no memory traffic. No GEMM can beat it,
// so a GEMM's fraction of it says how much any other library could still gain.
double fma_peak_gflops(int threads) {
  constexpr int kChains = 12;
  constexpr int64_t kIterations = 4'000'000;
  double best = 1e30;
  float sink = 0.0f;
  for (int rep = 0; rep < 5; ++rep) {
    const double start = now_seconds();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      cpu::FloatVector chains[kChains] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
      const cpu::FloatVector scale(0.999999f), shift(1e-7f);
      for (int64_t i = 0; i < kIterations; ++i) {
        for (cpu::FloatVector& chain : chains) chain = cpu::vec::fma(chain, scale, shift);
      }
      float lanes[cpu::FloatVector::kWidth];
      for (const cpu::FloatVector& chain : chains) {
        chain.store(lanes);
        sink += lanes[0];
      }
    }
    best = std::min(best, now_seconds() - start);
  }
  if (sink == 42.0f) fmt::print("");  // keeps the chains alive
  return 2.0 * static_cast<double>(cpu::FloatVector::kWidth) * kChains * static_cast<double>(kIterations) * threads /
         best * 1e-9;
}

// One row of the table: a [M, K] x [K, N] product.
struct Case {
  std::string name;
  int64_t m, k, n;
  std::function<Tensor()> tessera;
  std::function<void(RowMatrix&)> eigen;
};

void run_case(const Case& c, double peak_gflops) {
  const double flops = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.k) * static_cast<double>(c.n);
  RowMatrix out(c.m, c.n);
  const std::vector<double> seconds = best_seconds({
      [&] { c.tessera(); },
      [&] { c.eigen(out); },
      [&] {  // Eigen with a fresh output per call, as tessera allocates one
        RowMatrix fresh(c.m, c.n);
        c.eigen(fresh);
      },
  });
  const auto gflops = [&](double s) { return flops / s * 1e-9; };
  fmt::print("{:<36} {:>6} {:>6} {:>6} {:>8.1f} {:>8.1f} {:>6.2f} {:>8.1f} {:>6.2f} {:>7.2f} {:>7.2f}\n", c.name, c.m,
             c.k, c.n, gflops(seconds[0]), gflops(seconds[1]), seconds[1] / seconds[0], gflops(seconds[2]),
             seconds[2] / seconds[0], gflops(seconds[0]) / peak_gflops, gflops(seconds[1]) / peak_gflops);
}

Tensor random(const Shape& shape, uint64_t seed) { return ops::randn(shape, PhiloxKey{seed, 0}); }

RowMap map(const Tensor& t) { return RowMap(t.data_ptr<float>(), t.size(0), t.size(1)); }

// y = x @ W^T for a weight [out, in] (nn.Linear layout), and its backward
// products dX = dY @ W and dW = dY^T @ X, each via matmul (and linear).
void add_layer(std::vector<Case>& cases, const std::string& name, int64_t tokens, int64_t in, int64_t out,
               uint64_t seed) {
  const Tensor x = random({tokens, in}, seed), weight = random({out, in}, seed + 1);
  const Tensor grad_y = random({tokens, out}, seed + 2), weight_t = ops::transpose(weight, 0, 1);
  cases.push_back({name + " fwd linear x W^T", tokens, in, out, [=] { return ops::linear(x, weight, Tensor()); },
                   [=](RowMatrix& y) { y.noalias() = map(x) * map(weight).transpose(); }});
  cases.push_back({name + " fwd matmul x W^T", tokens, in, out, [=] { return ops::matmul(x, weight_t); },
                   [=](RowMatrix& y) { y.noalias() = map(x) * map(weight).transpose(); }});
  cases.push_back({name + " bwd dX = dY W", tokens, out, in, [=] { return ops::matmul(grad_y, weight); },
                   [=](RowMatrix& dx) { dx.noalias() = map(grad_y) * map(weight); }});
  const Tensor grad_y_t = ops::transpose(grad_y, 0, 1);
  cases.push_back({name + " bwd dW = dY^T X", out, tokens, in, [=] { return ops::matmul(grad_y_t, x); },
                   [=](RowMatrix& dw) { dw.noalias() = map(grad_y).transpose() * map(x); }});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera GEMM benchmark: ops::matmul/linear vs Eigen, f32"};
  int threads = 1;
  app.add_option("--threads", threads, "intra-op threads (OpenMP team for both)")->check(CLI::PositiveNumber);
  app.add_flag("--cpu-time", use_cpu_clock, "time with the process CPU clock (single-threaded runs on a busy machine)");
  CLI11_PARSE(app, argc, argv);
  if (use_cpu_clock && threads != 1) {
    fmt::print(stderr, "--cpu-time needs --threads 1 (idle OpenMP threads spin and would count)\n");
    return 1;
  }
  set_num_threads(threads);

  fmt::print("# matmul bench: f32, threads={}, cpu={} ({} cores online, load average {}), vector ISA {}, {} clock\n",
             threads, bench::cpu_model(), std::thread::hardware_concurrency(), bench::load_average(), bench::vector_isa(),
             use_cpu_clock ? "process CPU" : "wall");
  fmt::print("# tessera's GEMM: {} (TESSERA_GEMM={}); eigen: Eigen {}.{}.{} called directly\n", gemm_description(),
             gemm_backend_name(gemm_backend()), EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
  const double peak = fma_peak_gflops(threads);
  fmt::print("# GFLOP/s, best of >=5 alternating timed calls after a warm-up. eigen: into an output made once;\n"
             "# eigen+alloc: into a fresh output each call (tessera allocates one each call). ratio = tessera / eigen\n"
             "# FMA peak ({} x {}-lane FMA chains on {} thread(s), measured now): {:.1f} GFLOP/s; t/peak, e/peak:\n"
             "# tessera's and eigen's fraction of it\n",
             cpu::FloatVector::kInstructionSet, cpu::FloatVector::kWidth, threads, peak);

  std::vector<Case> cases;
  for (int64_t size : {1024, 2048}) {
    const Tensor a = random({size, size}, 1), b = random({size, size}, 2);
    cases.push_back({fmt::format("square {}", size), size, size, size, [=] { return ops::matmul(a, b); },
                     [=](RowMatrix& c) { c.noalias() = map(a) * map(b); }});
  }
  const int64_t tokens = 4 * 64, channels = 768;
  add_layer(cases, "qkv", tokens, channels, 3 * channels, 10);
  add_layer(cases, "attn proj", tokens, channels, channels, 20);
  add_layer(cases, "fc", tokens, channels, 4 * channels, 30);
  add_layer(cases, "fc proj", tokens, 4 * channels, channels, 40);
  add_layer(cases, "lm head (tied wte)", tokens, channels, 50257, 50);

  fmt::print("{:<36} {:>6} {:>6} {:>6} {:>8} {:>8} {:>6} {:>8} {:>6} {:>7} {:>7}\n", "shape", "M", "K", "N", "tessera",
             "eigen", "ratio", "e+alloc", "ratio", "t/peak", "e/peak");
  for (const Case& c : cases) run_case(c, peak);
  return 0;
}
