#pragma once
// Maps a linear element index of a logical shape to element offsets in up to kMaxOperands
// strided operands. Built on the host from Tensors, passed to kernels by value.
#include <cstdint>

#include "dpar/tensor/tensor.h"

namespace dpar::cuda {

inline constexpr int kMaxDims = 8;

template <int K>
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[K][kMaxDims] = {};

  // Offsets (in elements) of logical element `linear` in each operand.
  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&out)[K]) const {
#pragma unroll
    for (int k = 0; k < K; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int k = 0; k < K; ++k) out[k] += i * strides[k][d];
    }
  }
};

// Builds an indexer over `shape` for operands with the given strides; size-1 dims are dropped
// so that broadcast and squeezed dims cost nothing.
template <int K>
StridedIndexer<K> make_indexer(const Shape& shape, const Shape* const (&strides)[K]) {
  StridedIndexer<K> ix;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    DPAR_CHECK(ix.ndim < kMaxDims, "CUDA kernels support up to ", kMaxDims, " dims, got shape ",
               shape);
    ix.sizes[ix.ndim] = shape[d];
    for (int k = 0; k < K; ++k) ix.strides[k][ix.ndim] = (*strides[k])[d];
    ++ix.ndim;
  }
  return ix;
}

// Grid-stride loop over [0, n).
#define DPAR_CUDA_KERNEL_LOOP(i, n)                                                      \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace dpar::cuda
