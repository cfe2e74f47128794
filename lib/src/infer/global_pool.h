#pragma once
// dpar::infer's global average pooling (GlobalAveragePool: the squeeze-and-excitation blocks'
// squeeze and the head's pool), in place of oneDNN's pooling primitive.
//
// Why: oneDNN 2.6's AVX2 pooling treats a global pool as a window pool with a 7x7..56x56
// window, and on MobileNetV3-small's shapes it ran 3-12x slower than a plain sum over the map
// (576 channels at 7x7, one image: 15.7 us against 1.3 us; batch 32: 0.42 ms against 0.07
// ms), which made pooling ~5% of a batch-1 forward.
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>

#include "dpar/tensor/tensor.h"

namespace dpar::infer::detail {

// How the pool reads its f32 input: blocks of `block` channels innermost (oneDNN's nChw8c /
// nChw16c), or plain NCHW (block 1), or NHWC (channels_last).
struct PoolLayout {
  int64_t block = 1;
  bool channels_last = false;
};

// The layout of an f32 [N,C,H,W] md this pool reads, or nullopt (oneDNN then pools it).
std::optional<PoolLayout> global_pool_layout(const dnnl::memory::desc& md);

// The [N,C,1,1] output's md in the matching layout.
dnnl::memory::desc global_pool_output_md(const dnnl::memory::desc& input_md);

// y[n,c] = mean over the H*W map of x[n,c]. The sum's order depends only on the shape, so
// the bits do not depend on the thread count or on how the batch is split.
void global_average_pool(const float* x, float* y, const Shape& dims, PoolLayout layout);

}  // namespace dpar::infer::detail
