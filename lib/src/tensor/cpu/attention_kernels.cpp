// CPU scaled dot-product attention: the (batch, head) slices in parallel, each computed while
// its Q, K, V and scores are in cache - two small sgemms around a row softmax - instead of
// three passes over whole tensors. The softmax is kept for the backward (B * Lq * Lk floats).
#include "tensor/attention_kernels.h"

#include <oneapi/dnnl/dnnl.h>

#if defined(__x86_64__)
// GCC 12 reports its own AVX-512 reduction intrinsics' _mm512_undefined operands as
// uninitialised (a false positive); the intrinsics are used only in this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dpar/core/error.h"
#include "tensor/cpu/isa.h"
#include "tensor/unary_math.h"
#include "tensor/zero_rows.h"

namespace dpar::cpu {
namespace {

// c[m,n] = alpha * op(a) op(b) + beta * c, row-major, inside one thread (oneDNN's sgemm runs
// single-threaded within an OpenMP parallel region).
void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  DPAR_CHECK(status == dnnl_success, "scaled_dot_product_attention: oneDNN sgemm failed (",
             static_cast<int>(status), ")");
}

// Row reductions in kLanes independent partials: one float accumulator is a serial chain the
// compiler may not reorder (no -ffast-math), while lanes become one vector register. The
// order is fixed, so results stay deterministic.
constexpr int64_t kLanes = 16;

// The portable forms of the two row passes: the masks, the causal cut and the softmax of one
// row of scores, in place (keys past the cut get exactly zero weight); and the softmax backward
// of one slice's rows, dS = P * (dP - rowsum(dO * O)), in place over dP.
void softmax_row_baseline(float* row, const float* mask, int64_t visible, int64_t lk) {
  if (mask) {
    for (int64_t j = 0; j < visible; ++j) row[j] += mask[j];
  }
  const int64_t body = visible - visible % kLanes;
  float lane_max[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane_max[l] = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      lane_max[l] = row[j + l] > lane_max[l] ? row[j + l] : lane_max[l];
    }
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t l = 0; l < kLanes; ++l) m = lane_max[l] > m ? lane_max[l] : m;
  for (int64_t j = body; j < visible; ++j) m = row[j] > m ? row[j] : m;
  for (int64_t j = 0; j < visible; ++j) row[j] = kernels::fast_exp(row[j] - m);
  float lane_sum[kLanes] = {};
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lane_sum[l] += row[j + l];
  }
  float sum = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane_sum[l];
  for (int64_t j = body; j < visible; ++j) sum += row[j];
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
  for (int64_t j = visible; j < lk; ++j) row[j] = 0.f;
}

void softmax_backward_rows_baseline(float* ds, const float* p, const float* d_o, int64_t ld_do,
                                    const float* o, int64_t ld_o, int64_t lq, int64_t lk,
                                    int64_t ev) {
  const int64_t body = ev - ev % kLanes;
  for (int64_t i = 0; i < lq; ++i) {
    const float* orow = o + i * ld_o;
    const float* grow = d_o + i * ld_do;
    float lanes[kLanes] = {};
    for (int64_t j = 0; j < body; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += grow[j + l] * orow[j + l];
    }
    float dot = 0.f;
    for (int64_t l = 0; l < kLanes; ++l) dot += lanes[l];
    for (int64_t j = body; j < ev; ++j) dot += grow[j] * orow[j];
    float* dsrow = ds + i * lk;
    const float* prow = p + i * lk;
    for (int64_t j = 0; j < lk; ++j) dsrow[j] = prow[j] * (dsrow[j] - dot);
  }
}

#if DPAR_HAVE_ISA_CLONES
// AVX-512 forms of the two row passes, with intrinsics. A row's softmax is one long chain of
// dependent steps (max, reduce, exp, sum, reduce, divide: ~150 cycles for a 65-key row) with
// little work beside it, so rows go four at a time, their chains interleaved; the compiled
// loops above spent a tenth of ViT-Tiny's attention time here. Every load and store is masked
// to the row's visible keys, which covers both the tail vector and the causal cut.
// exp_avx512 is fast_exp's steps, one vector at a time (same clamp, rounding, Cody-Waite split
// and polynomial).
DPAR_TARGET_AVX512 inline __m512 exp_avx512(__m512 x) {
  // min/max return their second operand when either is NaN, so a NaN passes the clamp.
  x = _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-87.3365447504020f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e_r = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(e_r, _mm512_castsi512_ps(bits));
}

// The lanes of the 16-float vector at key j that fall before key `end`.
DPAR_TARGET_AVX512 inline __mmask16 lanes_before(int64_t end, int64_t j) {
  const int64_t count = end - j;
  return count >= 16  ? __mmask16(0xFFFF)
         : count <= 0 ? __mmask16(0)
                      : __mmask16((1u << count) - 1u);
}

// Softmax of rows [i0, i0 + R) of one slice's scores s (rows lk apart) in place.
template <int R>
DPAR_TARGET_AVX512 void softmax_row_group_avx512(float* s, const float* mask, int64_t i0,
                                                 int64_t lk, bool causal) {
  int64_t visible[R];
  __m512 acc[R];
  for (int r = 0; r < R; ++r) {
    visible[r] = causal ? std::min(lk, i0 + r + 1) : lk;
    acc[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t j = 0; j < lk; j += 16) {
    for (int r = 0; r < R; ++r) {
      const __mmask16 live = lanes_before(visible[r], j);
      float* row = s + (i0 + r) * lk;
      __m512 x = _mm512_maskz_loadu_ps(live, row + j);
      if (mask) {
        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(live, mask + (i0 + r) * lk + j));
        _mm512_mask_storeu_ps(row + j, live, x);
      }
      acc[r] = _mm512_mask_max_ps(acc[r], live, acc[r], x);
    }
  }
  __m512 row_max[R];
  for (int r = 0; r < R; ++r) {
    row_max[r] = _mm512_set1_ps(_mm512_reduce_max_ps(acc[r]));
    acc[r] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < lk; j += 16) {
    for (int r = 0; r < R; ++r) {
      const __mmask16 live = lanes_before(visible[r], j);
      float* row = s + (i0 + r) * lk;
      const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, row + j), row_max[r]));
      _mm512_mask_storeu_ps(row + j, live, e);
      acc[r] = _mm512_mask_add_ps(acc[r], live, acc[r], e);
    }
  }
  __m512 inv[R];
  for (int r = 0; r < R; ++r) inv[r] = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(acc[r]));
  for (int64_t j = 0; j < lk; j += 16) {
    // Keys past the causal cut get exactly zero weight.
    const __mmask16 in_row = lanes_before(lk, j);
    for (int r = 0; r < R; ++r) {
      float* row = s + (i0 + r) * lk;
      const __m512 x = _mm512_maskz_loadu_ps(lanes_before(visible[r], j), row + j);
      _mm512_mask_storeu_ps(row + j, in_row, _mm512_mul_ps(x, inv[r]));
    }
  }
}

DPAR_TARGET_AVX512 void softmax_rows_avx512(float* s, const float* mask, int64_t lq, int64_t lk,
                                            bool causal) {
  int64_t i = 0;
  for (; i + 4 <= lq; i += 4) softmax_row_group_avx512<4>(s, mask, i, lk, causal);
  for (; i < lq; ++i) softmax_row_group_avx512<1>(s, mask, i, lk, causal);
}

// dS = P * (dP - rowsum(dO * O)) for rows [i0, i0 + R) of one slice, in place over dP.
template <int R>
DPAR_TARGET_AVX512 void softmax_backward_row_group_avx512(float* ds, const float* p,
                                                          const float* d_o, int64_t ld_do,
                                                          const float* o, int64_t ld_o, int64_t i0,
                                                          int64_t lk, int64_t ev) {
  __m512 dot[R];
  for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < ev; j += 16) {
    const __mmask16 live = lanes_before(ev, j);
    for (int r = 0; r < R; ++r) {
      dot[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, d_o + (i0 + r) * ld_do + j),
                               _mm512_maskz_loadu_ps(live, o + (i0 + r) * ld_o + j), dot[r]);
    }
  }
  for (int r = 0; r < R; ++r) dot[r] = _mm512_set1_ps(_mm512_reduce_add_ps(dot[r]));
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 live = lanes_before(lk, j);
    for (int r = 0; r < R; ++r) {
      float* dsrow = ds + (i0 + r) * lk;
      const __m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, dsrow + j), dot[r]);
      _mm512_mask_storeu_ps(dsrow + j, live,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(live, p + (i0 + r) * lk + j), g));
    }
  }
}

DPAR_TARGET_AVX512 void softmax_backward_rows_avx512(float* ds, const float* p, const float* d_o,
                                                     int64_t ld_do, const float* o, int64_t ld_o,
                                                     int64_t lq, int64_t lk, int64_t ev) {
  int64_t i = 0;
  for (; i + 4 <= lq; i += 4) {
    softmax_backward_row_group_avx512<4>(ds, p, d_o, ld_do, o, ld_o, i, lk, ev);
  }
  for (; i < lq; ++i) softmax_backward_row_group_avx512<1>(ds, p, d_o, ld_do, o, ld_o, i, lk, ev);
}
#endif

// The softmax of one slice's lq rows of scores s in place; mask: the slice's [lq, lk] additive
// mask or null; causal: row i sees keys 0..i.
void softmax_rows(float* s, const float* mask, int64_t lq, int64_t lk, bool causal) {
#if DPAR_HAVE_ISA_CLONES
  if (cpu_isa() == Isa::avx512) return softmax_rows_avx512(s, mask, lq, lk, causal);
#endif
  for (int64_t i = 0; i < lq; ++i) {
    softmax_row_baseline(s + i * lk, mask ? mask + i * lk : nullptr,
                         causal ? std::min(lk, i + 1) : lk, lk);
  }
}

void softmax_backward_rows(float* ds, const float* p, const float* d_o, int64_t ld_do,
                           const float* o, int64_t ld_o, int64_t lq, int64_t lk, int64_t ev) {
#if DPAR_HAVE_ISA_CLONES
  if (cpu_isa() == Isa::avx512) {
    return softmax_backward_rows_avx512(ds, p, d_o, ld_do, o, ld_o, lq, lk, ev);
  }
#endif
  softmax_backward_rows_baseline(ds, p, d_o, ld_do, o, ld_o, lq, lk, ev);
}

// Asks for the `rows` x `cols` block at p (rows `ld` apart) to be brought into cache. The
// slices of a packed projection are strided (a head's 64 floats out of every 3E-float token
// row) and no two slices share a cache line, so each slice's operands come from beyond the
// core's caches; read while the slice before is being computed, they arrive in cache instead
// of stalling the small products (the hardware prefetcher does not follow such short strided
// runs far enough). Only reads: prefetching the output slices for writing as well measured
// slower.
void prefetch_block(const float* p, int64_t rows, int64_t cols, int64_t ld) {
  constexpr uintptr_t kLine = 64;
  for (int64_t i = 0; i < rows; ++i) {
    const auto first = reinterpret_cast<uintptr_t>(p + i * ld) & ~(kLine - 1);
    const auto last = reinterpret_cast<uintptr_t>(p + i * ld + cols - 1);
    for (uintptr_t line = first; line <= last; line += kLine) {
      __builtin_prefetch(reinterpret_cast<const void*>(line));
    }
  }
}

// Whether the next slice's operands (`floats` in all) are worth prefetching: only while they
// fit in a fraction of a core's L2 beside the current slice's; larger ones would evict the
// data being computed on (ViT's slices are 50 KB; the gain was measured there).
bool worth_prefetching(int64_t floats) {
  return floats * static_cast<int64_t>(sizeof(float)) <= 256 * 1024;
}

// Slice b = n * H + h of a [N, H, L, D] operand with unit stride along D: its first element
// and the distance between its rows.
template <typename T>
struct Slices {
  T* base;
  int64_t heads, stride_n, stride_h, ld;
  Slices(const Tensor& t, T* data)
      : base(data),
        heads(t.size(1)),
        stride_n(t.stride(0)),
        stride_h(t.stride(1)),
        ld(t.stride(2)) {
    DPAR_CHECK(t.dim() == 4 && (t.stride(3) == 1 || t.size(3) == 1),
               "scaled_dot_product_attention: operand ", t.shape(), " with strides ", t.strides(),
               " is not [N, H, L, D] with unit stride along D");
    if (t.size(2) == 1) ld = std::max<int64_t>(ld, t.size(3));  // a lone row: any ld >= D
  }
  T* operator[](int64_t b) const { return base + (b / heads) * stride_n + (b % heads) * stride_h; }
};
Slices<const float> slices(const Tensor& t) { return {t, t.data<float>()}; }
Slices<float> slices(Tensor& t) { return {t, t.data<float>()}; }

void sdpa_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      bool causal, float scale, Tensor& out, Tensor& probs) {
  const int64_t batch = q.size(0) * q.size(1), lq = q.size(2), e = q.size(3);
  const int64_t lk = k.size(2), ev = v.size(3);
  const auto sq = slices(q), sk = slices(k), sv = slices(v);
  const auto so = slices(out);
  const float* pm = mask.defined() ? mask.data<float>() : nullptr;
  float* pp = probs.data<float>();
  const bool prefetch = worth_prefetching(lq * e + lk * e + lk * ev);
#pragma omp parallel for schedule(static) if (batch > 1)
  for (int64_t b = 0; b < batch; ++b) {
    if (prefetch && b + 1 < batch) {
      prefetch_block(sq[b + 1], lq, e, sq.ld);
      prefetch_block(sk[b + 1], lk, e, sk.ld);
      prefetch_block(sv[b + 1], lk, ev, sv.ld);
    }
    float* s = pp + b * lq * lk;
    sgemm('N', 'T', lq, lk, e, scale, sq[b], sq.ld, sk[b], sk.ld, 0.f, s, lk);
    softmax_rows(s, pm ? pm + b * lq * lk : nullptr, lq, lk, causal);
    sgemm('N', 'N', lq, ev, lk, 1.f, s, lk, sv[b], sv.ld, 0.f, so[b], so.ld);
  }
}

// One slice's backward when only a few query rows of dO are nonzero (a classifier reading the
// class token: in the last block only that query's output reaches the loss). Every other row
// of dS and dQ is then exactly zero, so the products run on the nonzero rows R alone:
// dV = P_R^T dO_R, dS_R = P_R * (dO_R V^T - rowsum(dO_R * O_R)), dQ_R = scale dS_R K and
// dK = scale dS_R^T Q_R; the other rows of dQ are zero. The same sums as the full products
// (rounded in another order), as linear_backward_rows (ops_linear.cpp) does for a linear layer.
struct QueryRows {
  std::vector<int64_t> rows;
  std::vector<float> d_o, p, o, q, ds, dq;
  int64_t lq = 0, lk = 0, e = 0, ev = 0;

  // Finds dO's nonzero rows and copies the operands' rows R; false (dense) where they are more
  // than half of lq.
  bool gather(const float* d_o_in, int64_t ld_do, const float* p_in, const float* o_in,
              int64_t ld_o, const float* q_in, int64_t ld_q, int64_t lq_, int64_t lk_, int64_t e_,
              int64_t ev_) {
    lq = lq_, lk = lk_, e = e_, ev = ev_;
    if (!detail::few_nonzero_rows(d_o_in, lq, ev, ld_do, rows)) return false;
    const auto r = static_cast<size_t>(rows.size());
    d_o.resize(r * ev), o.resize(r * ev), p.resize(r * lk), q.resize(r * e);
    ds.resize(r * lk), dq.resize(r * e);
    for (size_t t = 0; t < r; ++t) {
      const int64_t i = rows[t];
      std::copy_n(d_o_in + i * ld_do, ev, d_o.data() + t * ev);
      std::copy_n(o_in + i * ld_o, ev, o.data() + t * ev);
      std::copy_n(p_in + i * lk, lk, p.data() + t * lk);
      std::copy_n(q_in + i * ld_q, e, q.data() + t * e);
    }
    return true;
  }

  void backward(const float* k, int64_t ld_k, const float* v, int64_t ld_v, float scale, float* d_q,
                int64_t ld_dq, float* d_k, int64_t ld_dk, float* d_v, int64_t ld_dv) {
    const auto r = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < lq; ++i) std::fill_n(d_q + i * ld_dq, e, 0.f);
    if (r == 0) {
      for (int64_t j = 0; j < lk; ++j) {
        std::fill_n(d_k + j * ld_dk, e, 0.f);
        std::fill_n(d_v + j * ld_dv, ev, 0.f);
      }
      return;
    }
    sgemm('T', 'N', lk, ev, r, 1.f, p.data(), lk, d_o.data(), ev, 0.f, d_v, ld_dv);
    sgemm('N', 'T', r, lk, ev, 1.f, d_o.data(), ev, v, ld_v, 0.f, ds.data(), lk);
    softmax_backward_rows(ds.data(), p.data(), d_o.data(), ev, o.data(), ev, r, lk, ev);
    sgemm('N', 'N', r, e, lk, scale, ds.data(), lk, k, ld_k, 0.f, dq.data(), e);
    for (int64_t t = 0; t < r; ++t) std::copy_n(dq.data() + t * e, e, d_q + rows[t] * ld_dq);
    sgemm('T', 'N', lk, e, r, scale, ds.data(), lk, q.data(), e, 0.f, d_k, ld_dk);
  }
};

void sdpa_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                       const Tensor& out, const Tensor& dout, float scale, Tensor& dq, Tensor& dk,
                       Tensor& dv) {
  const int64_t batch = q.size(0) * q.size(1), lq = q.size(2), e = q.size(3);
  const int64_t lk = k.size(2), ev = v.size(3);
  const auto sq = slices(q), sk = slices(k), sv = slices(v), so = slices(out);
  const auto sdo = slices(dout);
  const auto sdq = slices(dq), sdk = slices(dk), sdv = slices(dv);
  const float* pp = probs.data<float>();
  const bool prefetch = worth_prefetching(lq * e + lk * e + lk * ev + lq * ev);
#pragma omp parallel
  {
    // dS for one slice at a time, per thread, and the query rows of a sparse dO.
    std::vector<float> ds(static_cast<size_t>(lq * lk));
    QueryRows sparse;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; ++b) {
      if (prefetch && b + 1 < batch) {
        prefetch_block(sq[b + 1], lq, e, sq.ld);
        prefetch_block(sk[b + 1], lk, e, sk.ld);
        prefetch_block(sv[b + 1], lk, ev, sv.ld);
        prefetch_block(sdo[b + 1], lq, ev, sdo.ld);
      }
      const float* p = pp + b * lq * lk;
      if (sparse.gather(sdo[b], sdo.ld, p, so[b], so.ld, sq[b], sq.ld, lq, lk, e, ev)) {
        sparse.backward(sk[b], sk.ld, sv[b], sv.ld, scale, sdq[b], sdq.ld, sdk[b], sdk.ld, sdv[b],
                        sdv.ld);
        continue;
      }
      // dV = P^T dO
      sgemm('T', 'N', lk, ev, lq, 1.f, p, lk, sdo[b], sdo.ld, 0.f, sdv[b], sdv.ld);
      // dS = P * (dO V^T - rowsum(dO * O))
      sgemm('N', 'T', lq, lk, ev, 1.f, sdo[b], sdo.ld, sv[b], sv.ld, 0.f, ds.data(), lk);
      softmax_backward_rows(ds.data(), p, sdo[b], sdo.ld, so[b], so.ld, lq, lk, ev);
      // dQ = scale dS K, dK = scale dS^T Q
      sgemm('N', 'N', lq, e, lk, scale, ds.data(), lk, sk[b], sk.ld, 0.f, sdq[b], sdq.ld);
      sgemm('T', 'N', lk, e, lq, scale, ds.data(), lk, sq[b], sq.ld, 0.f, sdk[b], sdk.ld);
    }
  }
}

}  // namespace

void register_attention_kernels() {
  kernels::sdpa_forward.set(DeviceType::CPU, &sdpa_forward_cpu);
  kernels::sdpa_backward.set(DeviceType::CPU, &sdpa_backward_cpu);
}

}  // namespace dpar::cpu
