// CPU scaled dot-product attention: the (batch, head) slices in parallel, each computed while
// its Q, K, V and scores are in cache - two small sgemms around a row softmax - instead of
// three passes over whole tensors. The softmax is kept for the backward (B * Lq * Lk floats).
#include "tensor/attention_kernels.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dpar/core/error.h"
#include "tensor/cpu/isa.h"
#include "tensor/unary_math.h"

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

// Masks, the causal cut and the softmax of one row of scores, in place; once per ISA.
// clang-format off
#define DPAR_SOFTMAX_ROW(SUFFIX, TARGET)                                                     \
  TARGET void softmax_row##SUFFIX(float* row, const float* mask, int64_t visible,          \
                                  int64_t lk) {                                            \
    const float neg_inf = -std::numeric_limits<float>::infinity();                         \
    if (mask) {                                                                            \
      for (int64_t j = 0; j < lk; ++j) row[j] += mask[j];                                  \
    }                                                                                      \
    for (int64_t j = visible; j < lk; ++j) row[j] = neg_inf;                               \
    float m = neg_inf;                                                                     \
    for (int64_t j = 0; j < lk; ++j) m = row[j] > m ? row[j] : m;                          \
    float sum = 0.f;                                                                       \
    for (int64_t j = 0; j < lk; ++j) {                                                     \
      row[j] = kernels::fast_exp(row[j] - m);                                              \
      sum += row[j];                                                                       \
    }                                                                                      \
    const float inv = 1.f / sum;                                                           \
    for (int64_t j = 0; j < lk; ++j) row[j] *= inv;                                        \
  }
DPAR_SOFTMAX_ROW(_baseline, )
DPAR_SOFTMAX_ROW(_avx512, DPAR_TARGET_AVX512)
// clang-format on
#undef DPAR_SOFTMAX_ROW

void softmax_row(float* row, const float* mask, int64_t visible, int64_t lk) {
  if (cpu_isa() == Isa::avx512) return softmax_row_avx512(row, mask, visible, lk);
  softmax_row_baseline(row, mask, visible, lk);
}

void sdpa_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      bool causal, float scale, Tensor& out, Tensor& probs) {
  const int64_t batch = q.size(0), lq = q.size(1), e = q.size(2);
  const int64_t lk = k.size(1), ev = v.size(2);
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pm = mask.defined() ? mask.data<float>() : nullptr;
  float* po = out.data<float>();
  float* pp = probs.data<float>();
#pragma omp parallel for schedule(static) if (batch > 1)
  for (int64_t b = 0; b < batch; ++b) {
    float* s = pp + b * lq * lk;
    sgemm('N', 'T', lq, lk, e, scale, pq + b * lq * e, e, pk + b * lk * e, e, 0.f, s, lk);
    for (int64_t i = 0; i < lq; ++i) {
      softmax_row(s + i * lk, pm ? pm + (b * lq + i) * lk : nullptr,
                  causal ? std::min(lk, i + 1) : lk, lk);
    }
    sgemm('N', 'N', lq, ev, lk, 1.f, s, lk, pv + b * lk * ev, ev, 0.f, po + b * lq * ev, ev);
  }
}

void sdpa_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                       const Tensor& out, const Tensor& dout, float scale, Tensor& dq, Tensor& dk,
                       Tensor& dv) {
  const int64_t batch = q.size(0), lq = q.size(1), e = q.size(2);
  const int64_t lk = k.size(1), ev = v.size(2);
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pp = probs.data<float>();
  const float* po = out.data<float>();
  const float* pdo = dout.data<float>();
  float* pdq = dq.data<float>();
  float* pdk = dk.data<float>();
  float* pdv = dv.data<float>();
#pragma omp parallel for schedule(static) if (batch > 1)
  for (int64_t b = 0; b < batch; ++b) {
    const float* p = pp + b * lq * lk;
    const float* d_o = pdo + b * lq * ev;
    // dV = P^T dO
    sgemm('T', 'N', lk, ev, lq, 1.f, p, lk, d_o, ev, 0.f, pdv + b * lk * ev, ev);
    // dS = P * (dO V^T - rowsum(dO * O)), built in a per-thread buffer.
    std::vector<float> ds(static_cast<size_t>(lq * lk));
    sgemm('N', 'T', lq, lk, ev, 1.f, d_o, ev, pv + b * lk * ev, ev, 0.f, ds.data(), lk);
    for (int64_t i = 0; i < lq; ++i) {
      const float* orow = po + (b * lq + i) * ev;
      const float* grow = d_o + i * ev;
      float dot = 0.f;
      for (int64_t j = 0; j < ev; ++j) dot += grow[j] * orow[j];
      float* dsrow = ds.data() + i * lk;
      const float* prow = p + i * lk;
      for (int64_t j = 0; j < lk; ++j) dsrow[j] = prow[j] * (dsrow[j] - dot);
    }
    // dQ = scale dS K, dK = scale dS^T Q
    sgemm('N', 'N', lq, e, lk, scale, ds.data(), lk, pk + b * lk * e, e, 0.f, pdq + b * lq * e, e);
    sgemm('T', 'N', lk, e, lq, scale, ds.data(), lk, pq + b * lq * e, e, 0.f, pdk + b * lk * e, e);
  }
}

}  // namespace

void register_attention_kernels() {
  kernels::sdpa_forward.set(DeviceType::CPU, &sdpa_forward_cpu);
  kernels::sdpa_backward.set(DeviceType::CPU, &sdpa_backward_cpu);
}

}  // namespace dpar::cpu
