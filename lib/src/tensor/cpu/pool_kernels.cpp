// CPU global average pooling. Channels-last rows put C innermost, so the per-channel sums
// vectorise across channels; the plain NCHW layout sums each channel's contiguous plane.
#include <vector>

#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

void global_avg_pool2d_forward_cpu(const Tensor& x, Tensor& y) {
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const float* px = x.data<float>();
  float* py = y.data<float>();  // [N,C,1,1], contiguous
  const float scale = 1.0f / static_cast<float>(HW);
  if (x.is_contiguous(MemoryFormat::ChannelsLast)) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> acc(static_cast<size_t>(C), 0.0f);
      float* a = acc.data();
      const float* xn = px + n * HW * C;
      for (int64_t p = 0; p < HW; ++p) {
        const float* row = xn + p * C;
        for (int64_t c = 0; c < C; ++c) a[c] += row[c];
      }
      for (int64_t c = 0; c < C; ++c) py[n * C + c] = a[c] * scale;
    }
    return;
  }
  // Contiguous NCHW: eight partial sums per plane let the compiler vectorise the reduction
  // while keeping a fixed summation order.
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const float* plane = px + nc * HW;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t p = 0;
    for (; p + 8 <= HW; p += 8) {
      for (int k = 0; k < 8; ++k) part[k] += plane[p + k];
    }
    float s = 0.0f;
    for (; p < HW; ++p) s += plane[p];
    for (int k = 0; k < 8; ++k) s += part[k];
    py[nc] = s * scale;
  }
}

void global_avg_pool2d_backward_cpu(const Tensor& dy, Tensor& dx) {
  const int64_t N = dx.size(0), C = dx.size(1), HW = dx.size(2) * dx.size(3);
  const float* pg = dy.data<float>();
  const int64_t sn = dy.stride(0), sc = dy.stride(1);
  float* px = dx.data<float>();
  const float scale = 1.0f / static_cast<float>(HW);
  if (dx.is_contiguous(MemoryFormat::ChannelsLast)) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> v(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) v[c] = pg[n * sn + c * sc] * scale;
      float* xn = px + n * HW * C;
      for (int64_t p = 0; p < HW; ++p) {
        float* row = xn + p * C;
        for (int64_t c = 0; c < C; ++c) row[c] = v[c];
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const float v = pg[(nc / C) * sn + (nc % C) * sc] * scale;
    float* plane = px + nc * HW;
    for (int64_t p = 0; p < HW; ++p) plane[p] = v;
  }
}

}  // namespace

void register_pool_kernels() {
  kernels::global_avg_pool2d_forward.set(DeviceType::CPU, &global_avg_pool2d_forward_cpu);
  kernels::global_avg_pool2d_backward.set(DeviceType::CPU, &global_avg_pool2d_backward_cpu);
}

}  // namespace dpar::cpu
