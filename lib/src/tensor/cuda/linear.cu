// Matrix products on cuBLAS. Row-major dpar matrices are column-major matrices transposed, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T without copies: transposed views are
// passed as they are, like the CPU backend does for oneDNN's sgemm.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/cuda_libraries.h"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/gemm_operand.h"
#include "tensor/linear_kernels.h"

namespace dpar::cuda {
namespace {

using detail::as_gemm_operand;
using detail::GemmOperand;

template <class T>
__global__ void fill_rows_with_bias(T* c, const T* bias, int64_t bias_stride, int64_t m,
                                    int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, m * n) { c[i] = bias[(i % n) * bias_stride]; }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      DPAR_FAIL("gemm on CUDA supports f32, f16 and bf16, got ", t);
  }
}

void start_from_bias(const Tensor& bias, Tensor& c, int64_t m, int64_t n) {
  const cudaStream_t stream = current_stream();
  switch (c.dtype()) {
    case DType::f32:
      fill_rows_with_bias<<<blocks_for(m * n), kThreads, 0, stream>>>(
          static_cast<float*>(c.raw_data()), static_cast<const float*>(bias.raw_data()),
          bias.stride(0), m, n);
      break;
    case DType::f16:
      fill_rows_with_bias<<<blocks_for(m * n), kThreads, 0, stream>>>(
          static_cast<__half*>(c.raw_data()), static_cast<const __half*>(bias.raw_data()),
          bias.stride(0), m, n);
      break;
    default:
      fill_rows_with_bias<<<blocks_for(m * n), kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(c.raw_data()),
          static_cast<const __nv_bfloat16*>(bias.raw_data()), bias.stride(0), m, n);
      break;
  }
  check_launch("gemm bias");
}

void gemm_cuda(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
               Tensor& c) {
  DeviceGuard guard(c.device());
  DPAR_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype() &&
                 (!bias.defined() || bias.dtype() == c.dtype()),
             "gemm on CUDA needs one dtype for all operands, got ", a.dtype(), ", ", b.dtype(),
             " -> ", c.dtype());
  const cudaDataType_t type = cuda_type(c.dtype());
  const int64_t m = c.size(0), n = c.size(1);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  float beta = 0.f;
  if (bias.defined()) {
    start_from_bias(bias, c, m, n);
    beta = 1.f;
  }
  if (k == 0) {
    if (!bias.defined()) {
      check(cudaMemsetAsync(c.raw_data(), 0, c.nbytes(), current_stream()), "gemm zero fill");
    }
    return;
  }
  const GemmOperand ga = as_gemm_operand(a);
  const GemmOperand gb = as_gemm_operand(b);
  const cublasOperation_t op_a = trans_a != ga.stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b != gb.stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = 1.f;
  DPAR_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX,
             "gemm on CUDA: dimensions beyond 2^31 are not supported (", m, "x", k, "x", n, ")");
  // f32 compute: no TF32 for f32 data (PyTorch's default for matmul), tensor cores with f32
  // accumulation for f16/bf16 data.
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  check_cublas(cublasGemmEx(cublas_handle(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), &alpha, gb.data, type, static_cast<int>(gb.ld),
                            ga.data, type, static_cast<int>(ga.ld), &beta, c.raw_data(), type,
                            static_cast<int>(n), compute, CUBLAS_GEMM_DEFAULT),
               "gemm (cublasGemmEx)");
}

}  // namespace

void register_linear_kernels() { kernels::gemm.set(DeviceType::CUDA, &gemm_cuda); }

}  // namespace dpar::cuda
