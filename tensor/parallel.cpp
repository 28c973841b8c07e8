// Thread-count control. Eigen reads omp_get_max_threads() per call, so one
// setting governs both, per calling thread.
#include "tensor/parallel.h"

#include <omp.h>

#include "tensor/error.h"

namespace tessera {

void set_num_threads(int threads) {
  TESSERA_CHECK(threads >= 1, "set_num_threads: need at least 1 thread, got {}", threads);
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace tessera
