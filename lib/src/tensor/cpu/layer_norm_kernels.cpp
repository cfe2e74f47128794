// CPU layer normalisation over rows of a contiguous [R, D] matrix: rows in parallel, each in
// two passes (mean, then the centred variance, as PyTorch's CPU kernel: no cancellation), the
// backward in one pass over rows.
#include "tensor/layer_norm_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/isa.h"

namespace dpar::cpu {
namespace {

// Sums over a row kept in kLanes independent partial sums: a float reduction in one
// accumulator is a serial chain the compiler may not reorder (no -ffast-math), while lanes
// become one vector register. The order is fixed, so results stay deterministic.
constexpr int64_t kLanes = 16;

// One row's statistics and output, and one row's input gradient with its contribution to the
// weight and bias gradients; cloned per ISA (cpu/isa.h).
// clang-format off
#define DPAR_LN_ROWS(SUFFIX, TARGET)                                                          \
  TARGET void forward_row##SUFFIX(const float* xr, float* yr, const float* pw,               \
                                  const float* pb, int64_t d, float eps, float* mean,        \
                                  float* rstd) {                                             \
    const float inv_d = 1.f / static_cast<float>(d);                                         \
    const int64_t body = d - d % kLanes;                                                     \
    float lanes[kLanes] = {};                                                                \
    for (int64_t j = 0; j < body; j += kLanes) {                                             \
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += xr[j + l];                            \
    }                                                                                        \
    float s = 0.f;                                                                           \
    for (int64_t l = 0; l < kLanes; ++l) s += lanes[l];                                      \
    for (int64_t j = body; j < d; ++j) s += xr[j];                                           \
    const float mu = s * inv_d;                                                              \
    float sq[kLanes] = {};                                                                   \
    for (int64_t j = 0; j < body; j += kLanes) {                                             \
      for (int64_t l = 0; l < kLanes; ++l) sq[l] += (xr[j + l] - mu) * (xr[j + l] - mu);     \
    }                                                                                        \
    float v = 0.f;                                                                           \
    for (int64_t l = 0; l < kLanes; ++l) v += sq[l];                                         \
    for (int64_t j = body; j < d; ++j) v += (xr[j] - mu) * (xr[j] - mu);                     \
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
                                   float mu, float rs, int64_t d, float* dr, float* acc_w,   \
                                   float* acc_b) {                                           \
    const float inv_d = 1.f / static_cast<float>(d);                                         \
    const int64_t body = d - d % kLanes;                                                     \
    float lanes_g[kLanes] = {}, lanes_gx[kLanes] = {};                                       \
    for (int64_t j = 0; j < body; j += kLanes) {                                             \
      for (int64_t l = 0; l < kLanes; ++l) {                                                 \
        const float g = pw ? gr[j + l] * pw[j + l] : gr[j + l];                              \
        lanes_g[l] += g;                                                                     \
        lanes_gx[l] += g * (xr[j + l] - mu);                                                 \
      }                                                                                      \
    }                                                                                        \
    float sum_g = 0.f, sum_gx = 0.f;                                                         \
    for (int64_t l = 0; l < kLanes; ++l) {                                                   \
      sum_g += lanes_g[l];                                                                   \
      sum_gx += lanes_gx[l];                                                                 \
    }                                                                                        \
    for (int64_t j = body; j < d; ++j) {                                                     \
      const float g = pw ? gr[j] * pw[j] : gr[j];                                            \
      sum_g += g;                                                                            \
      sum_gx += g * (xr[j] - mu);                                                            \
    }                                                                                        \
    const float mean_g = sum_g * inv_d, mean_gx = sum_gx * rs * inv_d;                       \
    if (dr) {                                                                                \
      for (int64_t j = 0; j < d; ++j) {                                                      \
        const float g = pw ? gr[j] * pw[j] : gr[j];                                          \
        dr[j] = rs * (g - mean_g - (xr[j] - mu) * rs * mean_gx);                             \
      }                                                                                      \
    }                                                                                        \
    for (int64_t j = 0; j < d; ++j) {                                                        \
      acc_w[j] += gr[j] * (xr[j] - mu) * rs;                                                 \
      acc_b[j] += gr[j];                                                                     \
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

// dr += row, each sum rounded once: the same bits as adding dx to the other gradient after.
// Kept out of backward_row so that no multiply there fuses with this add.
void add_row(float* dr, const float* row, int64_t d) {
  for (int64_t j = 0; j < d; ++j) dr[j] += row[j];
}

// One pass over x and dy: blocks of rows in parallel, each writing its rows of dx and its own
// partial weight and bias gradients, which are then added in block order - the same sums
// whatever the thread count. Accumulating, a row's dx goes through a row buffer (in L1) and is
// then added into dx.
void layer_norm_backward_cpu(const Tensor& x, const Tensor& dy, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                             Tensor& dbias, bool accumulate_dx) {
  const int64_t rows = x.size(0), d = x.size(1);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  const float* pw = weight.defined() ? weight.data<float>() : nullptr;
  float* pdx = dx.defined() ? dx.data<float>() : nullptr;
  constexpr int64_t kBlockRows = 128;
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * d), 0.f);
  const bool wide = cpu_isa() == Isa::avx512;
  const bool add_into_dx = pdx && accumulate_dx;
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t b = 0; b < blocks; ++b) {
    float* acc_w = partial.data() + b * 2 * d;
    float* acc_b = acc_w + d;
    std::vector<float> row(add_into_dx ? static_cast<size_t>(d) : 0);
    for (int64_t r = b * kBlockRows; r < std::min(rows, (b + 1) * kBlockRows); ++r) {
      float* dr = pdx ? (add_into_dx ? row.data() : pdx + r * d) : nullptr;
      if (wide) {
        backward_row_avx512(px + r * d, pdy + r * d, pw, pm[r], pr[r], d, dr, acc_w, acc_b);
      } else {
        backward_row_baseline(px + r * d, pdy + r * d, pw, pm[r], pr[r], d, dr, acc_w, acc_b);
      }
      if (add_into_dx) add_row(pdx + r * d, row.data(), d);
    }
  }
  for (int64_t b = 1; b < blocks; ++b) {
    const float* acc = partial.data() + b * 2 * d;
    for (int64_t j = 0; j < 2 * d; ++j) partial[static_cast<size_t>(j)] += acc[j];
  }
  if (dweight.defined()) std::copy_n(partial.data(), d, dweight.data<float>());
  if (dbias.defined()) std::copy_n(partial.data() + d, d, dbias.data<float>());
}

}  // namespace

void register_layer_norm_kernels() {
  kernels::layer_norm_forward.set(DeviceType::CPU, &layer_norm_forward_cpu);
  kernels::layer_norm_backward.set(DeviceType::CPU, &layer_norm_backward_cpu);
}

}  // namespace dpar::cpu
