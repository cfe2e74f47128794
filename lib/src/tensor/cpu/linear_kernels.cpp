// CPU matrix products through oneDNN (JIT-compiled for the host ISA, OpenMP threads, run-to-run
// deterministic for a fixed thread count): sgemm, and the matmul primitive when a bias (and a
// residual) is added or when a linear layer's weights are worth reordering into its blocked
// layout.
#include "tensor/linear_kernels.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dpar/autograd/grad_mode.h"
#include "dpar/tensor/ops.h"
#include "tensor/cpu/column_sums.h"
#include "tensor/cpu/onednn_context.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/gemm_operand.h"

namespace dpar::cpu {
namespace {

using detail::as_gemm_operand;
using detail::GemmOperand;

struct Matmul {
  dnnl::memory::desc a_md, b_md, bias_md, c_md;
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

// Whether this is an AMD CPU. Its cores (Zen 4: AVX-512 on 256-bit datapaths) rank oneDNN's
// two product paths differently from Intel's, where the choices below were first measured.
bool amd_cpu() {
#if defined(__x86_64__)
  static const bool amd = [] {
    __builtin_cpu_init();  // in case the first product runs in a static initialiser
    return __builtin_cpu_is("amd") != 0;
  }();
  return amd;
#else
  return false;
#endif
}

// Whether c = a^T b with a long reduction (a linear layer's weight gradient G^T X, summed over
// the batch's rows) runs faster on the matmul primitive than on sgemm, both in their plain
// layouts. Measured on ViT-Tiny's layers (backward on one core, caches flushed, interleaved)
// on an Intel Xeon: the primitive is faster where the gradient has at least twice as many rows
// as columns (qkv 576x192: 13.9 -> 12.8 ms and 12.8 -> 12.3 ms for the whole backward; fc1
// 768x192: 18.7 -> 16.7 and 18.5 -> 16.7 ms), no different at 192x192 and slower at 192x768
// (fc2: 15.0 -> 15.9). In the training step the gain is smaller: linear backward / forward
// time 2.09 -> 2.06 (five alternating runs each), ~4 ms of a ~550 ms step.
// On an AMD EPYC (Zen 4) sgemm is the faster one for every weight gradient (one core: qkv 8.8
// against 9.1 ms, fc1 11.2 against 13.1 ms): the primitive first copies the transposed G
// (jit_brgemm_matmul_copy_a_transposed, 2.5% of the step under perf). linear_backward over 8
// ViT-Tiny steps: 2069-2168 ms on the primitive, 1955-1960 ms on sgemm (three alternations).
bool weight_gradient_on_matmul(char ta, char tb, int64_t m, int64_t n, int64_t k) {
  return !amd_cpu() && ta == 'T' && tb == 'N' && k >= 4 * std::max(m, n) && m >= 2 * n;
}

// Whether product() runs c = op(a) op(b) (+ bias) on the matmul primitive rather than sgemm.
bool on_matmul_primitive(char ta, char tb, int64_t m, int64_t n, int64_t k, bool bias) {
  return bias || pack_weights_first(tb, m, n, k) || weight_gradient_on_matmul(ta, tb, m, n, k);
}

// The cached matmul primitive for c[m, n] = op(a) op(b) (+ bias) (+ a residual, by a binary-add
// post-op when `residual`), operands as sgemm takes them
// (row-major storage with a leading dimension, 'T' = transposed); c is contiguous.
// Operands a and b are f32, or bf16 (amp::Autocast) with c in f32 or bf16; the bias is f32.
const Matmul& matmul_for(char ta, int64_t lda, char tb, int64_t ldb, bool bias, int64_t m,
                         int64_t n, int64_t k, bool pack, bool residual = false,
                         DType ab_dtype = DType::f32, DType c_dtype = DType::f32) {
  using dnnl::memory;
  onednn::Key key(onednn::Kind::matmul);
  key.add(m).add(n).add(k).add(ta).add(lda).add(tb).add(ldb).add(bias).add(pack).add(residual);
  key.add(static_cast<int64_t>(ab_dtype)).add(static_cast<int64_t>(c_dtype));
  return onednn::cached<Matmul>(key, [&] {
    const memory::data_type ab = onednn::data_type(ab_dtype, "gemm");
    const memory::data_type ct = onednn::data_type(c_dtype, "gemm");
    const memory::dims a_strides = ta == 'N' ? memory::dims{lda, 1} : memory::dims{1, lda};
    const memory::dims b_strides = tb == 'N' ? memory::dims{ldb, 1} : memory::dims{1, ldb};
    Matmul entry;
    entry.a_md = memory::desc({m, k}, ab, a_strides);
    entry.b_md = memory::desc({k, n}, ab, b_strides);
    entry.bias_md = memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1});
    entry.c_md = memory::desc({m, n}, ct, memory::dims{n, 1});
    dnnl::primitive_attr attr = onednn::default_attr();
    if (residual) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, entry.c_md);
      attr.set_post_ops(ops);
    }
    auto describe = [&](const memory::desc& weights_md) {
      const auto desc = bias ? dnnl::matmul::desc(entry.a_md, weights_md, entry.bias_md, entry.c_md)
                             : dnnl::matmul::desc(entry.a_md, weights_md, entry.c_md);
      return dnnl::matmul::primitive_desc(desc, attr, onednn::engine());
    };
    entry.pd = describe(pack ? memory::desc({k, n}, ab, memory::format_tag::any) : entry.b_md);
    // Where the ISA has no blocked layout (oneDNN 2.6 picks a plain one under AVX2), a reorder
    // would only transpose: take the weights as they are.
    if (pack && entry.pd.weights_desc().data.format_desc.blocking.inner_nblks == 0) {
      entry.pd = describe(entry.b_md);
    }
    entry.prim = dnnl::matmul(entry.pd);
    if (entry.pd.weights_desc() != entry.b_md) {
      entry.pack_weights.emplace(dnnl::reorder::primitive_desc(
          onednn::engine(), entry.b_md, onednn::engine(), entry.pd.weights_desc()));
    }
    return entry;
  });
}

// op(b) as e's primitive reads it: reordered into `packed` when e uses a blocked layout.
dnnl::memory weights_for(const Matmul& e, const void* b, onednn::OwnedMemory& packed) {
  dnnl::memory weights(e.b_md, onednn::engine(), const_cast<void*>(b));
  if (!e.pack_weights) return weights;
  packed = onednn::allocate(e.pd.weights_desc());
  onednn::execute(*e.pack_weights, dnnl::memory::desc(),
                  {{DNNL_ARG_FROM, weights}, {DNNL_ARG_TO, packed.memory}});
  return packed.memory;
}

// Runs e on a and c (at e's shapes) with weights as weights_for gave them; the matmul adds the
// bias as it writes each tile (a separate pass to spread the bias over c first cost as much as
// a small product).
void run_matmul(const Matmul& e, const void* a, const dnnl::memory& weights, const float* bias,
                void* c, const float* residual = nullptr) {
  const dnnl::engine& eng = onednn::engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(e.a_md, eng, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, weights},
      {DNNL_ARG_DST, dnnl::memory(e.c_md, eng, c)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(e.bias_md, eng, const_cast<float*>(bias)));
  if (residual) {  // e was made with the binary-add post-op that reads it
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 dnnl::memory(e.c_md, eng, const_cast<float*>(residual)));
  }
  onednn::execute(e.prim, e.pd.scratchpad_desc(), std::move(args));
}

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c) {
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, n);
  DPAR_CHECK(status == dnnl_success, "gemm: oneDNN sgemm failed with status ",
             static_cast<int>(status), " for [", m, "x", k, "] x [", k, "x", n, "]");
}

// c = op(a) op(b) (+ bias) (+ residual, a contiguous [m, n] when not null): gemm_cpu, and
// linear_residual_cpu for a linear layer with its residual connection. Where the product runs
// on the matmul primitive, the primitive adds the residual as a binary post-op while it writes
// each tile of c, instead of a separate pass that reads c and the residual back and writes
// their sum; on sgemm the sum follows the product. Either way c is the product's c plus the
// residual, rounded once more: what linear then add give, bit for bit.
void product(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
             const float* residual, Tensor& c) {
  const int64_t m = c.size(0), n = c.size(1);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  float* pc = c.data<float>();
  auto add_residual = [&] {
    if (!residual) return;
    const int64_t total = m * n;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < total; ++i) pc[i] += residual[i];
  };
  if (k == 0) {
    if (!bias.defined()) {
      std::fill(pc, pc + m * n, 0.f);
    } else {
      const Tensor row = bias.contiguous();
      for (int64_t i = 0; i < m; ++i) std::copy_n(row.data<float>(), n, pc + i * n);
    }
    add_residual();
    return;
  }
  const GemmOperand ga = as_gemm_operand(a);
  const GemmOperand gb = as_gemm_operand(b);
  // op(a) = a^T exactly when the requested and the stored transposition differ.
  const char ta = trans_a != ga.stored_transposed ? 'T' : 'N';
  const char tb = trans_b != gb.stored_transposed ? 'T' : 'N';
  const auto* pa = static_cast<const float*>(ga.data);
  const auto* pb = static_cast<const float*>(gb.data);
  if (on_matmul_primitive(ta, tb, m, n, k, bias.defined())) {
    const bool pack = pack_weights_first(tb, m, n, k);
    const Tensor row = bias.defined() ? bias.contiguous() : Tensor();
    const Matmul& e =
        matmul_for(ta, ga.ld, tb, gb.ld, bias.defined(), m, n, k, pack, residual != nullptr);
    onednn::OwnedMemory packed;
    run_matmul(e, pa, weights_for(e, pb, packed), row.defined() ? row.data<float>() : nullptr, pc,
               residual);
    return;
  }
  sgemm(ta, tb, m, n, k, pa, ga.ld, pb, gb.ld, pc);
  add_residual();
}

// c = op(a) op(b) (+ bias) for bf16 a and b (amp::Autocast) on the matmul primitive, which
// accumulates in f32 and writes c in its dtype (f32 for the weight gradients: no rounding to
// bf16 in between); the bias is f32. Plain layouts: the products of an autocast step are the
// small linear layers of a CNN's head and attention's, where a reorder would not pay.
void product_bf16(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                  Tensor& c) {
  DPAR_CHECK(a.dtype() == DType::bf16 && b.dtype() == DType::bf16,
             "gemm on the CPU: operands must both be f32 or both bf16, got ", a.dtype(), " and ",
             b.dtype());
  DPAR_CHECK(c.dtype() == DType::f32 || c.dtype() == DType::bf16,
             "gemm on the CPU: the result must be f32 or bf16, got ", c.dtype());
  DPAR_CHECK(!bias.defined() || bias.dtype() == DType::f32,
             "gemm on the CPU: the bias of a bf16 product must be f32, got ", bias.dtype());
  const int64_t m = c.size(0), n = c.size(1);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: the bias alone (rare enough to take the general ops)
    NoGradGuard no_grad;
    c.copy_(bias.defined() ? expand(bias.reshape({1, n}), {m, n}) : Tensor::zeros({m, n}));
    return;
  }
  const GemmOperand ga = as_gemm_operand(a);
  const GemmOperand gb = as_gemm_operand(b);
  const char ta = trans_a != ga.stored_transposed ? 'T' : 'N';
  const char tb = trans_b != gb.stored_transposed ? 'T' : 'N';
  const Tensor row = bias.defined() ? bias.contiguous() : Tensor();
  const Matmul& e = matmul_for(ta, ga.ld, tb, gb.ld, bias.defined(), m, n, k, /*pack=*/false,
                               /*residual=*/false, DType::bf16, c.dtype());
  onednn::OwnedMemory unused;
  run_matmul(e, ga.data, weights_for(e, gb.data, unused),
             row.defined() ? row.data<float>() : nullptr, c.raw_data());
}

void gemm_cpu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c) {
  if (a.dtype() != DType::f32 || b.dtype() != DType::f32 || c.dtype() != DType::f32) {
    return product_bf16(a, trans_a, b, trans_b, bias, c);
  }
  product(a, trans_a, b, trans_b, bias, nullptr, c);
}

void linear_residual_cpu(const Tensor& a, const Tensor& w, const Tensor& bias,
                         const Tensor& residual, Tensor& c) {
  product(a, false, w, true, bias, residual.data<float>(), c);
}

// dx = g w and the bias gradient (linear_kernels.h). Where dx goes through sgemm, its rows go
// 256 per thread at a time and the bias gradient's block sums are taken from each block of g
// right after its product, while the block is in cache: on ViT-Tiny's fc2 (g [4160, 192],
// w [192, 768]) the backward went from ~17.5 to ~16.5 ms on one core, standalone; in the
// training step, linear backward / forward time 2.09 -> 2.08 (five alternating runs each,
// ~2 ms of a ~550 ms step). Where dx goes through the matmul primitive with reordered
// weights, splitting it measured no faster (the reorder and the primitive's own blocking), so
// it runs whole and g is summed after.
void linear_input_grad_cpu(const Tensor& g_in, const Tensor& w, Tensor& dx, Tensor& db) {
  const int64_t m = g_in.size(0), k = g_in.size(1), n = w.size(1);
  // g's rows must be rows of memory (a gradient almost always is contiguous already).
  const Tensor g = as_gemm_operand(g_in).stored_transposed ? g_in.contiguous() : g_in;
  const GemmOperand gg = as_gemm_operand(g), gw = as_gemm_operand(w);
  const char tb = gw.stored_transposed ? 'T' : 'N';
  const auto* pg = static_cast<const float*>(gg.data);
  if (m == 0 || n == 0 || k == 0 || pack_weights_first(tb, m, n, k)) {
    // The whole product as gemm_cpu runs it, then the sums.
    gemm_cpu(g, false, w, false, Tensor(), dx);
    if (db.defined()) column_sums(pg, m, k, gg.ld, db.data<float>());
    return;
  }
  const auto* pw = static_cast<const float*>(gw.data);
  float* pdx = dx.data<float>();
  const int64_t rows_per_block = kColumnSumBlockRows * std::max(1, omp_get_max_threads());
  const int64_t sub_blocks = (m + kColumnSumBlockRows - 1) / kColumnSumBlockRows;
  std::vector<double> partial(db.defined() ? static_cast<size_t>(sub_blocks * k) : 0);
  for (int64_t r0 = 0; r0 < m; r0 += rows_per_block) {
    const int64_t rows = std::min(rows_per_block, m - r0);
    sgemm('N', tb, rows, n, k, pg + r0 * gg.ld, gg.ld, pw, gw.ld, pdx + r0 * n);
    if (!db.defined()) continue;
    const int64_t first = r0 / kColumnSumBlockRows;
    const int64_t last = (r0 + rows + kColumnSumBlockRows - 1) / kColumnSumBlockRows;
#pragma omp parallel for schedule(static) if (last - first > 1)
    for (int64_t s = first; s < last; ++s) {
      const int64_t s0 = s * kColumnSumBlockRows;
      column_sum_block(pg + s0 * gg.ld, std::min(kColumnSumBlockRows, m - s0), k, gg.ld,
                       partial.data() + s * k);
    }
  }
  if (db.defined()) add_block_sums(partial.data(), sub_blocks, k, db.data<float>());
}

}  // namespace

void register_linear_kernels() {
  kernels::gemm.set(DeviceType::CPU, &gemm_cpu);
  kernels::linear_input_grad.set(DeviceType::CPU, &linear_input_grad_cpu);
  kernels::linear_residual.set(DeviceType::CPU, &linear_residual_cpu);
}

}  // namespace dpar::cpu
