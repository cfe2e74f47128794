#pragma once
// How a convolution's activations are described to cuDNN (tensor/cuda/conv.cpp); host-only, so
// the CPU unit tests check it on machines without a GPU.
#include <array>
#include <cstdint>

#include "dpar/tensor/tensor.h"

namespace dpar::detail {

// The strides cuDNN is given for an activation [N,C,H,W]. A tensor dense in one of the two
// layouts is described with that layout's canonical strides, whatever its size-1 dimensions
// carry: [N,C,1,1] from global pooling is both contiguous and channels-last, and raw strides
// such as (C,1,1,1) read to cuDNN as neither, next to an NHWC filter: a mix its NHWC kernels
// refuse (PyTorch rewrites size-1 strides before every descriptor for this reason). Where both
// layouts fit, the filter's layout decides (prefer_nhwc). Other strided views keep their own.
inline std::array<int64_t, 4> cudnn_activation_strides(const Tensor& t, bool prefer_nhwc) {
  const int64_t C = t.size(1), H = t.size(2), W = t.size(3);
  const bool nhwc = t.is_contiguous(MemoryFormat::ChannelsLast);
  const bool nchw = t.is_contiguous(MemoryFormat::Contiguous);
  if (nhwc && (prefer_nhwc || !nchw)) return {H * W * C, 1, W * C, C};
  if (nchw) return {C * H * W, H * W, W, 1};
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

}  // namespace dpar::detail
