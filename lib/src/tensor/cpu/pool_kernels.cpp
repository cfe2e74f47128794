// CPU global average pooling, for f32 and bf16 (amp::Autocast's activations, summed in f32).
// Channels-last rows put C innermost, so the per-channel sums vectorise across channels; the
// plain NCHW layout sums each channel's contiguous plane.
#include <vector>

#include "tensor/cpu/float_types.h"
#include "tensor/nn_kernels.h"

namespace dpar::cpu {
namespace {

template <class T>
void global_avg_pool2d_forward_typed(const Tensor& x, Tensor& y) {
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const T* px = data_as<const T>(x);
  T* py = data_as<T>(y);  // [N,C,1,1], contiguous
  const float scale = 1.0f / static_cast<float>(HW);
  if (x.is_contiguous(MemoryFormat::ChannelsLast)) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> acc(static_cast<size_t>(C), 0.0f);
      float* a = acc.data();
      const T* xn = px + n * HW * C;
      for (int64_t p = 0; p < HW; ++p) {
        const T* row = xn + p * C;
        for (int64_t c = 0; c < C; ++c) a[c] += to_float(row[c]);
      }
      for (int64_t c = 0; c < C; ++c) py[n * C + c] = from_float<T>(a[c] * scale);
    }
    return;
  }
  // Contiguous NCHW: eight partial sums per plane let the compiler vectorise the reduction
  // while keeping a fixed summation order.
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const T* plane = px + nc * HW;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t p = 0;
    for (; p + 8 <= HW; p += 8) {
      for (int k = 0; k < 8; ++k) part[k] += to_float(plane[p + k]);
    }
    float s = 0.0f;
    for (; p < HW; ++p) s += to_float(plane[p]);
    for (int k = 0; k < 8; ++k) s += part[k];
    py[nc] = from_float<T>(s * scale);
  }
}

// dx = dy / (H*W) broadcast, or dx += it (Add): the value added has the bits of the one
// written, so adding here equals writing it and adding the two.
template <class T, bool Add>
void global_avg_pool2d_backward_typed(const Tensor& dy, Tensor& dx) {
  const int64_t N = dx.size(0), C = dx.size(1), HW = dx.size(2) * dx.size(3);
  const T* pg = data_as<const T>(dy);
  const int64_t sn = dy.stride(0), sc = dy.stride(1);
  T* px = data_as<T>(dx);
  const float scale = 1.0f / static_cast<float>(HW);
  if (dx.is_contiguous(MemoryFormat::ChannelsLast)) {
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
      std::vector<T> v(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) v[c] = from_float<T>(to_float(pg[n * sn + c * sc]) * scale);
      T* xn = px + n * HW * C;
      for (int64_t p = 0; p < HW; ++p) {
        T* row = xn + p * C;
        if constexpr (Add) {
          for (int64_t c = 0; c < C; ++c) row[c] = from_float<T>(to_float(row[c]) + to_float(v[c]));
        } else {
          for (int64_t c = 0; c < C; ++c) row[c] = v[c];
        }
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) if (N * C * HW > (1 << 16))
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const T v = from_float<T>(to_float(pg[(nc / C) * sn + (nc % C) * sc]) * scale);
    T* plane = px + nc * HW;
    if constexpr (Add) {
      const float add = to_float(v);
      for (int64_t p = 0; p < HW; ++p) plane[p] = from_float<T>(to_float(plane[p]) + add);
    } else {
      for (int64_t p = 0; p < HW; ++p) plane[p] = v;
    }
  }
}

void global_avg_pool2d_forward_cpu(const Tensor& x, Tensor& y) {
  require_same_float("global_avg_pool2d", x, y, "the output");
  visit_float_dtype(x.dtype(), "global_avg_pool2d", [&](auto tag) {
    global_avg_pool2d_forward_typed<typename decltype(tag)::type>(x, y);
  });
}

void global_avg_pool2d_backward_cpu(const Tensor& dy, Tensor& dx) {
  require_same_float("global_avg_pool2d backward", dx, dy, "the output gradient");
  visit_float_dtype(dx.dtype(), "global_avg_pool2d backward", [&](auto tag) {
    global_avg_pool2d_backward_typed<typename decltype(tag)::type, false>(dy, dx);
  });
}

void global_avg_pool2d_backward_add_cpu(const Tensor& dy, Tensor& dx) {
  require_same_float("global_avg_pool2d backward", dx, dy, "the output gradient");
  visit_float_dtype(dx.dtype(), "global_avg_pool2d backward", [&](auto tag) {
    global_avg_pool2d_backward_typed<typename decltype(tag)::type, true>(dy, dx);
  });
}

}  // namespace

void register_pool_kernels() {
  kernels::global_avg_pool2d_forward.set(DeviceType::CPU, &global_avg_pool2d_forward_cpu);
  kernels::global_avg_pool2d_backward.set(DeviceType::CPU, &global_avg_pool2d_backward_cpu);
  kernels::global_avg_pool2d_backward_add.set(DeviceType::CPU, &global_avg_pool2d_backward_add_cpu);
}

}  // namespace dpar::cpu
