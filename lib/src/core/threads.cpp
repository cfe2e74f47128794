#include "dpar/core/threads.h"

#include <omp.h>

#include "dpar/core/error.h"

namespace dpar {

void set_num_threads(int n) {
  DPAR_CHECK(n >= 1, "set_num_threads: thread count must be >= 1, got ", n);
  omp_set_num_threads(n);  // oneDNN (OpenMP runtime) and dpar's kernels share this pool
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace dpar
