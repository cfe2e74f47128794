#pragma once
// How a 2-D operand is handed to a BLAS gemm (oneDNN's sgemm on CPU, cuBLAS on CUDA): row-major
// storage of either t or t^T with a leading dimension. Transposed views pass without a copy;
// other layouts are copied. Shared by both backends (included from .cu files: C++17).
#include <algorithm>
#include <cstdint>

#include "dpar/tensor/tensor.h"

namespace dpar::detail {

struct GemmOperand {
  Tensor storage;  // keeps a contiguous copy alive when one was needed
  const void* data = nullptr;
  int64_t ld = 1;
  bool stored_transposed = false;  // memory holds t^T in row-major order
};

inline GemmOperand as_gemm_operand(const Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1);
  GemmOperand op;
  // Row-major: unit stride along columns; size-1 dims may carry any stride.
  if ((t.stride(1) == 1 || c == 1) && (r == 1 || t.stride(0) >= std::max<int64_t>(1, c))) {
    op.data = t.raw_data();
    op.ld = r == 1 ? std::max<int64_t>(1, c) : t.stride(0);
    return op;
  }
  // Column-major (e.g. a transposed view): memory holds t^T row-major.
  if ((t.stride(0) == 1 || r == 1) && (c == 1 || t.stride(1) >= std::max<int64_t>(1, r))) {
    op.data = t.raw_data();
    op.ld = c == 1 ? std::max<int64_t>(1, r) : t.stride(1);
    op.stored_transposed = true;
    return op;
  }
  op.storage = t.contiguous();
  op.data = op.storage.raw_data();
  op.ld = std::max<int64_t>(1, c);
  return op;
}

}  // namespace dpar::detail
