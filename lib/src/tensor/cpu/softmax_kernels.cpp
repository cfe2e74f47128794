// CPU kernels for softmax / log_softmax (forward, backward), fused cross-entropy, argmax and
// top-k indices. Row statistics are computed in a fixed order per line: deterministic.
#include "tensor/softmax_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "tensor/cpu/strided_loop.h"

namespace dpar::cpu {
namespace {

constexpr int64_t kParallelThreshold = 65536;
constexpr int64_t kMaxBlock = 256;  // lines per work item in the blocked (dim not inner) path

// A block of `count` lines along the softmax dim: line i starts at base + i * step and its
// K elements are `dim_stride` apart. Offsets are shared by all operands (equal strides).
struct LineBlock {
  int64_t base, count, step;
};

// Splits the lines of `shape` along dim into blocks and runs fn(block) in parallel (static
// schedule, independent blocks: the result does not depend on the thread count).
template <class Fn>
void for_each_line_block(const Shape& shape, const Shape& strides, int64_t dim, Fn&& fn) {
  const int64_t k = shape[static_cast<size_t>(dim)];
  Shape lines_shape = shape;
  lines_shape[static_cast<size_t>(dim)] = 1;
  std::vector<std::array<int64_t, 3>> rows;  // {offset, n, step}
  for_each_row<1>(
      lines_shape, {&strides},
      [&](const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& st) {
        rows.push_back({off[0], n, st[0]});
      });
  if (k == 0) return;
  const int64_t per_block = std::clamp<int64_t>(16384 / k, 1, kMaxBlock);
  std::vector<LineBlock> blocks;
  for (const auto& r : rows) {
    for (int64_t s = 0; s < r[1]; s += per_block) {
      blocks.push_back({r[0] + s * r[2], std::min(per_block, r[1] - s), r[2]});
    }
  }
  const int64_t nb = static_cast<int64_t>(blocks.size());
  const int64_t total = shape_numel(shape);
#pragma omp parallel for schedule(static) if (total > kParallelThreshold && nb > 1)
  for (int64_t b = 0; b < nb; ++b) fn(blocks[static_cast<size_t>(b)]);
}

void softmax_cpu(const Tensor& x, int64_t dim, bool log, Tensor& out) {
  const float* px = static_cast<const float*>(x.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  const int64_t k = x.size(dim), sd = x.stride(dim);
  for_each_line_block(x.shape(), x.strides(), dim, [&](const LineBlock& blk) {
    if (sd == 1) {  // each line is contiguous
      for (int64_t l = 0; l < blk.count; ++l) {
        const float* xi = px + blk.base + l * blk.step;
        float* o = po + blk.base + l * blk.step;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < k; ++j) mx = std::max(mx, xi[j]);
        float sum = 0.f;
        if (log) {
          for (int64_t j = 0; j < k; ++j) sum += std::exp(xi[j] - mx);
          // (x - max) - log(sum): x - max is exact near the maximum, as in PyTorch.
          const float log_sum = std::log(sum);
          for (int64_t j = 0; j < k; ++j) o[j] = (xi[j] - mx) - log_sum;
        } else {
          for (int64_t j = 0; j < k; ++j) {
            o[j] = std::exp(xi[j] - mx);
            sum += o[j];
          }
          const float inv = 1.f / sum;
          for (int64_t j = 0; j < k; ++j) o[j] *= inv;
        }
      }
      return;
    }
    // Lines side by side (the softmax dim is not innermost, e.g. channels of NCHW): walk
    // the dim in the outer loop so the inner loop runs across neighbouring lines.
    std::array<float, kMaxBlock> mx, sum;
    const int64_t c = blk.count, st = blk.step;
    std::fill_n(mx.begin(), c, -std::numeric_limits<float>::infinity());
    std::fill_n(sum.begin(), c, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const float* xi = px + blk.base + j * sd;
      for (int64_t l = 0; l < c; ++l) mx[l] = std::max(mx[l], xi[l * st]);
    }
    for (int64_t j = 0; j < k; ++j) {
      const float* xi = px + blk.base + j * sd;
      float* o = po + blk.base + j * sd;
      for (int64_t l = 0; l < c; ++l) {
        const float e = std::exp(xi[l * st] - mx[l]);
        if (!log) o[l * st] = e;
        sum[l] += e;
      }
    }
    if (log) {
      for (int64_t l = 0; l < c; ++l) sum[l] = std::log(sum[l]);
      for (int64_t j = 0; j < k; ++j) {
        const float* xi = px + blk.base + j * sd;
        float* o = po + blk.base + j * sd;
        for (int64_t l = 0; l < c; ++l) o[l * st] = (xi[l * st] - mx[l]) - sum[l];
      }
    } else {
      for (int64_t l = 0; l < c; ++l) sum[l] = 1.f / sum[l];
      for (int64_t j = 0; j < k; ++j) {
        float* o = po + blk.base + j * sd;
        for (int64_t l = 0; l < c; ++l) o[l * st] *= sum[l];
      }
    }
  });
}

// softmax:     dx = y * (g - sum(g * y))
// log_softmax: dx = g - exp(y) * sum(g)
void softmax_backward_cpu(const Tensor& grad, const Tensor& y, int64_t dim, bool log,
                          Tensor& grad_in) {
  const float* pg = static_cast<const float*>(grad.raw_data());
  const float* py = static_cast<const float*>(y.raw_data());
  float* po = static_cast<float*>(grad_in.raw_data());
  const int64_t k = y.size(dim), sd = y.stride(dim);
  for_each_line_block(y.shape(), y.strides(), dim, [&](const LineBlock& blk) {
    std::array<float, kMaxBlock> acc;
    const int64_t c = blk.count, st = blk.step;
    if (sd == 1) {
      for (int64_t l = 0; l < c; ++l) {
        const int64_t off = blk.base + l * st;
        const float *g = pg + off, *yi = py + off;
        float* o = po + off;
        float s = 0.f;
        if (log) {
          for (int64_t j = 0; j < k; ++j) s += g[j];
          for (int64_t j = 0; j < k; ++j) o[j] = g[j] - std::exp(yi[j]) * s;
        } else {
          for (int64_t j = 0; j < k; ++j) s += g[j] * yi[j];
          for (int64_t j = 0; j < k; ++j) o[j] = yi[j] * (g[j] - s);
        }
      }
      return;
    }
    std::fill_n(acc.begin(), c, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const float *g = pg + blk.base + j * sd, *yi = py + blk.base + j * sd;
      if (log) {
        for (int64_t l = 0; l < c; ++l) acc[l] += g[l * st];
      } else {
        for (int64_t l = 0; l < c; ++l) acc[l] += g[l * st] * yi[l * st];
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      const float *g = pg + blk.base + j * sd, *yi = py + blk.base + j * sd;
      float* o = po + blk.base + j * sd;
      if (log) {
        for (int64_t l = 0; l < c; ++l) o[l * st] = g[l * st] - std::exp(yi[l * st]) * acc[l];
      } else {
        for (int64_t l = 0; l < c; ++l) o[l * st] = yi[l * st] * (g[l * st] - acc[l]);
      }
    }
  });
}

// loss_i = (1-eps) * (lse_i - z_i[t_i]) + eps * (lse_i - mean_k z_ik), loss = mean_i loss_i;
// d loss / d z_ik = (softmax_ik - eps/K - (1-eps) [k == t_i]) / N.
void cross_entropy_cpu(const Tensor& logits, const Tensor& target, double label_smoothing,
                       Tensor& loss, Tensor& grad) {
  const int64_t n = logits.size(0), k = logits.size(1);
  const int64_t rs = logits.stride(0), cs = logits.stride(1);
  const float* pz = static_cast<const float*>(logits.raw_data());
  const int64_t* pt = static_cast<const int64_t*>(target.raw_data());
  const int64_t ts = target.stride(0);
  // Validate every target before any parallel work (no throwing inside OpenMP regions).
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = pt[i * ts];
    DPAR_CHECK(t >= 0 && t < k, "cross_entropy: target value ", t, " at position ", i,
               " is out of range for ", k, " classes (expected 0 <= target < ", k, ")");
  }
  const double eps = label_smoothing;
  const double inv_n = 1.0 / static_cast<double>(n);
  float* pg = grad.defined() ? grad.data<float>() : nullptr;
  std::vector<double> row_loss(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n * k > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const float* z = pz + i * rs;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < k; ++j) mx = std::max(mx, z[j * cs]);
    double sum = 0.0, zsum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      sum += std::exp(static_cast<double>(z[j * cs] - mx));
      zsum += z[j * cs];
    }
    const double lse = mx + std::log(sum);
    const int64_t t = pt[i * ts];
    row_loss[static_cast<size_t>(i)] =
        (1.0 - eps) * (lse - z[t * cs]) + eps * (lse - zsum / static_cast<double>(k));
    if (pg) {
      float* g = pg + i * k;
      const double off = eps / static_cast<double>(k);
      for (int64_t j = 0; j < k; ++j) {
        const double p = std::exp(static_cast<double>(z[j * cs]) - lse);
        g[j] = static_cast<float>((p - off) * inv_n);
      }
      g[t] = static_cast<float>(
          (std::exp(static_cast<double>(z[t * cs]) - lse) - off - (1.0 - eps)) * inv_n);
    }
  }
  double total = 0.0;
  for (double l : row_loss) total += l;
  *static_cast<float*>(loss.raw_data()) = static_cast<float>(total * inv_n);
}

void argmax_cpu(const Tensor& x, int64_t dim, Tensor& out) {
  // Walk x's lines along dim with out's strides spread over the remaining dims.
  Shape lines_shape = x.shape();
  lines_shape[static_cast<size_t>(dim)] = 1;
  Shape out_strides(x.shape().size(), 0);
  for (size_t d = 0, o = 0; d < out_strides.size(); ++d) {
    if (static_cast<int64_t>(d) != dim) out_strides[d] = out.strides()[o++];
  }
  const float* px = static_cast<const float*>(x.raw_data());
  int64_t* po = static_cast<int64_t*>(out.raw_data());
  const int64_t k = x.size(dim), sd = x.stride(dim);
  for_each_row<2>(
      lines_shape, {&x.strides(), &out_strides},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        for (int64_t l = 0; l < n; ++l) {
          const float* xi = px + off[0] + l * st[0];
          // First maximum; a NaN counts as the maximum (PyTorch semantics).
          float best = xi[0];
          int64_t idx = 0;
          for (int64_t j = 1; j < k && !std::isnan(best); ++j) {
            const float v = xi[j * sd];
            if (v > best || std::isnan(v)) {
              best = v;
              idx = j;
            }
          }
          po[off[1] + l * st[1]] = idx;
        }
      });
}

void topk_indices_cpu(const Tensor& x, int64_t k, Tensor& out) {
  const int64_t n = x.size(0), cols = x.size(1);
  const int64_t rs = x.stride(0), cs = x.stride(1);
  const float* px = static_cast<const float*>(x.raw_data());
  int64_t* po = out.data<int64_t>();
#pragma omp parallel if (n * cols > kParallelThreshold)
  {
    std::vector<int64_t> idx(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* row = px + i * rs;
      std::iota(idx.begin(), idx.end(), int64_t{0});
      // Larger first, NaN above everything, equal values by lower index: a strict weak
      // order, so the selection is fully determined.
      auto before = [&](int64_t a, int64_t b) {
        const float va = row[a * cs], vb = row[b * cs];
        const bool na = std::isnan(va), nb = std::isnan(vb);
        if (na != nb) return na;
        if (!na && va != vb) return va > vb;
        return a < b;
      };
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
      std::copy_n(idx.begin(), k, po + i * k);
    }
  }
}

}  // namespace

void register_softmax_kernels() {
  kernels::softmax.set(DeviceType::CPU, &softmax_cpu);
  kernels::softmax_backward.set(DeviceType::CPU, &softmax_backward_cpu);
  kernels::cross_entropy.set(DeviceType::CPU, &cross_entropy_cpu);
  kernels::argmax.set(DeviceType::CPU, &argmax_cpu);
  kernels::topk_indices.set(DeviceType::CPU, &topk_indices_cpu);
}

}  // namespace dpar::cpu
