// CPU matrix products through oneDNN (JIT-compiled for the host ISA, OpenMP threads, run-to-run
// deterministic for a fixed thread count): sgemm, and the matmul primitive when a bias is added
// or when a linear layer's weights are worth reordering into its blocked layout.
#include "tensor/linear_kernels.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "tensor/cpu/onednn_context.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/gemm_operand.h"

namespace dpar::cpu {
namespace {

using detail::as_gemm_operand;
using detail::GemmOperand;

struct Matmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  // Set when op(b) goes through the matmul's own blocked weights layout, into which it is
  // reordered on every call (weights change at every optimizer step).
  std::optional<dnnl::reorder> pack_weights;
};

// Whether c = op(a) op(b) with a tall `a` (the activations of a linear layer: many rows) and a
// small `b` (its weights) runs faster with op(b) reordered into oneDNN's blocked layout first.
// Measured on ViT-Tiny's products (4160 rows; 192, 576 and 768 features; one core, AVX-512):
// the blocked matmul is 6-10% faster than sgemm or the plain-layout matmul for the forward
// products and for dX = G W, the reorder included, except for a wide untransposed `b`
// (G [4160, 192] x W [192, 768]: sgemm 6.4 ms, blocked 6.8 ms). Deterministic in the shapes
// alone, so every run of a given program takes the same path.
bool pack_weights_first(char tb, int64_t m, int64_t n, int64_t k) {
  const bool tall_a = m >= 4 * std::max(n, k);
  const bool wide_untransposed_b = tb == 'N' && n >= 2 * k;
  return tall_a && !wide_untransposed_b;
}

// c = op(a) op(b) (+ bias) through oneDNN's matmul primitive, which adds the bias as it writes
// each tile (a separate pass to spread the bias over c first cost as much as a small product).
// Operands as sgemm takes them: row-major storage with a leading dimension, 'T' = transposed.
void matmul_primitive(char ta, const float* a, int64_t lda, char tb, const float* b, int64_t ldb,
                      const float* bias, float* c, int64_t m, int64_t n, int64_t k, bool pack) {
  using dnnl::memory;
  const memory::dims a_strides = ta == 'N' ? memory::dims{lda, 1} : memory::dims{1, lda};
  const memory::dims b_strides = tb == 'N' ? memory::dims{ldb, 1} : memory::dims{1, ldb};
  const memory::desc a_md({m, k}, memory::data_type::f32, a_strides);
  const memory::desc b_md({k, n}, memory::data_type::f32, b_strides);
  const memory::desc bias_md({1, n}, memory::data_type::f32, memory::dims{n, 1});
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{n, 1});
  onednn::Key key(onednn::Kind::matmul);
  key.add(m).add(n).add(k).add(ta).add(lda).add(tb).add(ldb).add(bias != nullptr).add(pack);
  const Matmul& e = onednn::cached<Matmul>(key, [&] {
    Matmul entry;
    auto describe = [&](const memory::desc& weights_md) {
      const auto desc = bias ? dnnl::matmul::desc(a_md, weights_md, bias_md, c_md)
                             : dnnl::matmul::desc(a_md, weights_md, c_md);
      return dnnl::matmul::primitive_desc(desc, onednn::default_attr(), onednn::engine());
    };
    entry.pd = describe(pack ? memory::desc({k, n}, memory::data_type::f32, memory::format_tag::any)
                             : b_md);
    // Where the ISA has no blocked layout (oneDNN 2.6 picks a plain one under AVX2), a reorder
    // would only transpose: take the weights as they are.
    if (pack && entry.pd.weights_desc().data.format_desc.blocking.inner_nblks == 0) {
      entry.pd = describe(b_md);
    }
    entry.prim = dnnl::matmul(entry.pd);
    if (entry.pd.weights_desc() != b_md) {
      entry.pack_weights.emplace(dnnl::reorder::primitive_desc(
          onednn::engine(), b_md, onednn::engine(), entry.pd.weights_desc()));
    }
    return entry;
  });
  const dnnl::engine& eng = onednn::engine();
  memory weights(b_md, eng, const_cast<float*>(b));
  onednn::OwnedMemory packed;
  if (e.pack_weights) {
    packed = onednn::allocate(e.pd.weights_desc());
    onednn::execute(*e.pack_weights, memory::desc(),
                    {{DNNL_ARG_FROM, weights}, {DNNL_ARG_TO, packed.memory}});
    weights = packed.memory;
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(a_md, eng, const_cast<float*>(a))},
                                       {DNNL_ARG_WEIGHTS, weights},
                                       {DNNL_ARG_DST, memory(c_md, eng, c)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(bias_md, eng, const_cast<float*>(bias)));
  onednn::execute(e.prim, e.pd.scratchpad_desc(), std::move(args));
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
  const bool pack = pack_weights_first(tb, m, n, k);
  if (bias.defined() || pack) {
    const Tensor row = bias.defined() ? bias.contiguous() : Tensor();
    matmul_primitive(ta, pa, ga.ld, tb, pb, gb.ld, row.defined() ? row.data<float>() : nullptr, pc,
                     m, n, k, pack);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, 1.f, pa, ga.ld, pb, gb.ld, 0.f, pc, n);
  DPAR_CHECK(status == dnnl_success, "gemm: oneDNN sgemm failed with status ",
             static_cast<int>(status), " for [", m, "x", k, "] x [", k, "x", n, "]");
}

}  // namespace

void register_linear_kernels() { kernels::gemm.set(DeviceType::CPU, &gemm_cpu); }

}  // namespace dpar::cpu
