// CPU layer normalisation over rows of a contiguous [R, D] matrix: rows in parallel, each in
// two passes (mean, then the centred variance, as PyTorch's CPU kernel: no cancellation).
#include "tensor/layer_norm_kernels.h"

#include <cmath>
#include <vector>

#include "tensor/cpu/isa.h"

namespace dpar::cpu {
namespace {

// One row's statistics and output; cloned per ISA (cpu/isa.h).
// clang-format off
#define DPAR_LN_ROWS(SUFFIX, TARGET)                                                          \
  TARGET void forward_row##SUFFIX(const float* xr, float* yr, const float* pw,               \
                                  const float* pb, int64_t d, float eps, float* mean,        \
                                  float* rstd) {                                             \
    const float inv_d = 1.f / static_cast<float>(d);                                         \
    float s = 0.f;                                                                           \
    for (int64_t j = 0; j < d; ++j) s += xr[j];                                              \
    const float mu = s * inv_d;                                                              \
    float v = 0.f;                                                                           \
    for (int64_t j = 0; j < d; ++j) v += (xr[j] - mu) * (xr[j] - mu);                        \
    const float rs = 1.f / std::sqrt(v * inv_d + eps);                                       \
    *mean = mu;                                                                              \
    *rstd = rs;                                                                              \
    for (int64_t j = 0; j < d; ++j) {                                                        \
      float out = (xr[j] - mu) * rs;                                                         \
      if (pw) out *= pw[j];                                                                  \
      if (pb) out += pb[j];                                                                  \
      yr[j] = out;                                                                           \
    }                                                                                        \
  }                                                                                          \
  TARGET void backward_row##SUFFIX(const float* xr, const float* gr, const float* pw,        \
                                   float mu, float rs, int64_t d, float* dr) {               \
    const float inv_d = 1.f / static_cast<float>(d);                                         \
    float sum_g = 0.f, sum_gx = 0.f;                                                         \
    for (int64_t j = 0; j < d; ++j) {                                                        \
      const float g = pw ? gr[j] * pw[j] : gr[j];                                            \
      sum_g += g;                                                                            \
      sum_gx += g * (xr[j] - mu);                                                            \
    }                                                                                        \
    const float mean_g = sum_g * inv_d, mean_gx = sum_gx * rs * inv_d;                       \
    for (int64_t j = 0; j < d; ++j) {                                                        \
      const float g = pw ? gr[j] * pw[j] : gr[j];                                            \
      dr[j] = rs * (g - mean_g - (xr[j] - mu) * rs * mean_gx);                               \
    }                                                                                        \
  }
DPAR_LN_ROWS(_baseline, )
DPAR_LN_ROWS(_avx512, DPAR_TARGET_AVX512)
// clang-format on
#undef DPAR_LN_ROWS

void layer_norm_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                            Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t rows = x.size(0), d = x.size(1);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  const bool wide = cpu_isa() == Isa::avx512;
  const float e = static_cast<float>(eps);
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    if (wide) {
      forward_row_avx512(px + r * d, py + r * d, pw, pb, d, e, pm + r, pr + r);
    } else {
      forward_row_baseline(px + r * d, py + r * d, pw, pb, d, e, pm + r, pr + r);
    }
  }
}

void layer_norm_backward_cpu(const Tensor& x, const Tensor& dy, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                             Tensor& dbias) {
  const int64_t rows = x.size(0), d = x.size(1);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  if (dx.defined()) {
    float* pdx = dx.data<float>();
    const bool wide = cpu_isa() == Isa::avx512;
#pragma omp parallel for schedule(static) if (rows * d > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      if (wide) {
        backward_row_avx512(px + r * d, pdy + r * d, pw, pm[r], pr[r], d, pdx + r * d);
      } else {
        backward_row_baseline(px + r * d, pdy + r * d, pw, pm[r], pr[r], d, pdx + r * d);
      }
    }
  }
  if (!dweight.defined() && !dbias.defined()) return;
  // Column sums over rows in row order, columns split across threads: deterministic.
  float* pdw = dweight.defined() ? dweight.data<float>() : nullptr;
  float* pdb = dbias.defined() ? dbias.data<float>() : nullptr;
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (d + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j0 = b * kBlock, j1 = std::min(d, j0 + kBlock);
    float acc_w[kBlock] = {}, acc_b[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * d;
      const float* gr = pdy + r * d;
      const float mu = pm[r], rs = pr[r];
      for (int64_t j = j0; j < j1; ++j) {
        acc_w[j - j0] += gr[j] * (xr[j] - mu) * rs;
        acc_b[j - j0] += gr[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      if (pdw) pdw[j] = acc_w[j - j0];
      if (pdb) pdb[j] = acc_b[j - j0];
    }
  }
}

}  // namespace

void register_layer_norm_kernels() {
  kernels::layer_norm_forward.set(DeviceType::CPU, &layer_norm_forward_cpu);
  kernels::layer_norm_backward.set(DeviceType::CPU, &layer_norm_backward_cpu);
}

}  // namespace dpar::cpu
