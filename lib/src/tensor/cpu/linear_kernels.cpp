// CPU matrix products through oneDNN (JIT-compiled for the host ISA, OpenMP threads, run-to-run
// deterministic for a fixed thread count): sgemm, and the matmul primitive when a bias is added.
#include "tensor/linear_kernels.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cpu/onednn_context.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/gemm_operand.h"

namespace dpar::cpu {
namespace {

using detail::as_gemm_operand;
using detail::GemmOperand;

struct MatmulBias {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// c = op(a) op(b) + bias through oneDNN's matmul primitive, which adds the bias as it writes
// each tile (a separate pass to spread the bias over c first cost as much as a small product).
// Operands as sgemm takes them: row-major storage with a leading dimension, 'T' = transposed.
void matmul_with_bias(char ta, const float* a, int64_t lda, char tb, const float* b, int64_t ldb,
                      const float* bias, float* c, int64_t m, int64_t n, int64_t k) {
  using dnnl::memory;
  const memory::dims a_strides = ta == 'N' ? memory::dims{lda, 1} : memory::dims{1, lda};
  const memory::dims b_strides = tb == 'N' ? memory::dims{ldb, 1} : memory::dims{1, ldb};
  const memory::desc a_md({m, k}, memory::data_type::f32, a_strides);
  const memory::desc b_md({k, n}, memory::data_type::f32, b_strides);
  const memory::desc bias_md({1, n}, memory::data_type::f32, memory::dims{n, 1});
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{n, 1});
  onednn::Key key(onednn::Kind::matmul_bias);
  key.add(m).add(n).add(k).add(ta).add(lda).add(tb).add(ldb);
  const MatmulBias& e = onednn::cached<MatmulBias>(key, [&] {
    MatmulBias entry;
    entry.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md),
                                            onednn::default_attr(), onednn::engine());
    entry.prim = dnnl::matmul(entry.pd);
    return entry;
  });
  const dnnl::engine& eng = onednn::engine();
  onednn::execute(e.prim, e.pd.scratchpad_desc(),
                  {{DNNL_ARG_SRC, memory(a_md, eng, const_cast<float*>(a))},
                   {DNNL_ARG_WEIGHTS, memory(b_md, eng, const_cast<float*>(b))},
                   {DNNL_ARG_BIAS, memory(bias_md, eng, const_cast<float*>(bias))},
                   {DNNL_ARG_DST, memory(c_md, eng, c)}});
}

void gemm_cpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c) {
  const int64_t m = c.size(0), n = c.size(1);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  float* pc = c.data<float>();
  if (k == 0) {
    if (!bias.defined()) {
      std::fill(pc, pc + m * n, 0.f);
      return;
    }
    const Tensor row = bias.contiguous();
    for (int64_t i = 0; i < m; ++i) std::copy_n(row.data<float>(), n, pc + i * n);
    return;
  }
  const GemmOperand ga = as_gemm_operand(a);
  const GemmOperand gb = as_gemm_operand(b);
  // op(a) = a^T exactly when the requested and the stored transposition differ.
  const char ta = trans_a != ga.stored_transposed ? 'T' : 'N';
  const char tb = trans_b != gb.stored_transposed ? 'T' : 'N';
  const auto* pa = static_cast<const float*>(ga.data);
  const auto* pb = static_cast<const float*>(gb.data);
  if (bias.defined()) {
    const Tensor row = bias.contiguous();
    matmul_with_bias(ta, pa, ga.ld, tb, pb, gb.ld, row.data<float>(), pc, m, n, k);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, 1.f, pa, ga.ld, pb, gb.ld, 0.f, pc, n);
  DPAR_CHECK(status == dnnl_success, "gemm: oneDNN sgemm failed with status ",
             static_cast<int>(status), " for [", m, "x", k, "] x [", k, "x", n, "]");
}

}  // namespace

void register_linear_kernels() { kernels::gemm.set(DeviceType::CPU, &gemm_cpu); }

}  // namespace dpar::cpu
