// Intra-op parallelism: one OpenMP team shared by Eigen's GEMM and our own
// kernels. Each thread (a simulated rank included) has its own team size.
#pragma once

#include <cstdint>

namespace tessera {

// Threads used by kernels called from this thread (default: all cores).
void set_num_threads(int threads);
int num_threads();

// Calls body(begin, end) over [0, count) split into contiguous chunks of at
// least `grain` items, in parallel when the work is large enough to pay for it.
template <typename Body>
void parallel_for(int64_t count, int64_t grain, const Body& body) {
  if (count <= 0) return;
  const int threads = num_threads();
  if (threads <= 1 || count <= grain) {
    body(int64_t{0}, count);
    return;
  }
  int64_t chunks = (count + grain - 1) / grain;
  if (chunks > threads) chunks = threads;
  const int64_t chunk_size = (count + chunks - 1) / chunks;
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * chunk_size;
    const int64_t end = begin + chunk_size < count ? begin + chunk_size : count;
    if (begin < end) body(begin, end);
  }
}

}  // namespace tessera
