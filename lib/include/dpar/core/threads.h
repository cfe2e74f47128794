#pragma once

namespace dpar {

// Intra-op threads used by oneDNN and dpar's own CPU kernels (OpenMP). The default comes
// from OMP_NUM_THREADS, else the number of cores.
void set_num_threads(int n);
int get_num_threads();

}  // namespace dpar
