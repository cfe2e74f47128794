// CPU matrix products through oneDNN's sgemm (JIT-compiled for the host ISA, OpenMP
// threads, run-to-run deterministic for a fixed thread count).
#include "tensor/linear_kernels.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cpu/strided_loop.h"
#include "tensor/gemm_operand.h"

namespace dpar::cpu {
namespace {

using detail::as_gemm_operand;
using detail::GemmOperand;

void gemm_cpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c) {
  const int64_t m = c.size(0), n = c.size(1);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  float* pc = c.data<float>();
  float beta = 0.f;
  if (bias.defined()) {
    // Start from the bias in every row and let sgemm accumulate onto it (beta = 1).
    const float* pb = static_cast<const float*>(bias.raw_data());
    const int64_t bs = bias.stride(0);
#pragma omp parallel for schedule(static) if (m * n > 65536)
    for (int64_t i = 0; i < m; ++i) {
      float* row = pc + i * n;
      for (int64_t j = 0; j < n; ++j) row[j] = pb[j * bs];
    }
    beta = 1.f;
  }
  if (k == 0) {
    if (!bias.defined()) std::fill(pc, pc + m * n, 0.f);
    return;
  }
  const GemmOperand ga = as_gemm_operand(a);
  const GemmOperand gb = as_gemm_operand(b);
  // op(a) = a^T exactly when the requested and the stored transposition differ.
  const char ta = trans_a != ga.stored_transposed ? 'T' : 'N';
  const char tb = trans_b != gb.stored_transposed ? 'T' : 'N';
  const dnnl_status_t status =
      dnnl_sgemm(ta, tb, m, n, k, 1.f, static_cast<const float*>(ga.data), ga.ld,
                 static_cast<const float*>(gb.data), gb.ld, beta, pc, n);
  DPAR_CHECK(status == dnnl_success, "gemm: oneDNN sgemm failed with status ",
             static_cast<int>(status), " for [", m, "x", k, "] x [", k, "x", n, "]");
}

}  // namespace

void register_linear_kernels() { kernels::gemm.set(DeviceType::CPU, &gemm_cpu); }

}  // namespace dpar::cpu
