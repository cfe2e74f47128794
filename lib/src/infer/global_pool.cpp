// dpar::infer's global average pooling: one pass over each map, four positions' partial sums
// per channel interleaved (so the adds pipeline), in an order fixed by the shape alone.
#include "infer/global_pool.h"

#include <vector>

#include "tensor/cpu/isa.h"

namespace dpar::infer::detail {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

constexpr int64_t kParallelThreshold = int64_t{1} << 15;  // elements; below, one thread

// out[k] = mean over HW positions `B` floats apart of p[k + position * B], k < B: one channel
// block of nChwBc, or (B = 1) one NCHW plane. P positions are summed interleaved, then their
// partial sums pairwise.
template <int64_t B, int64_t P>
[[gnu::always_inline]] inline void block_mean(const float* p, int64_t HW, float scale, float* out) {
  float acc[P][B] = {};
  int64_t i = 0;
  for (; i + P <= HW; i += P) {
    for (int64_t j = 0; j < P; ++j) {
      for (int64_t k = 0; k < B; ++k) acc[j][k] += p[(i + j) * B + k];
    }
  }
  for (; i < HW; ++i) {
    for (int64_t k = 0; k < B; ++k) acc[0][k] += p[i * B + k];
  }
  for (int64_t width = P / 2; width > 0; width /= 2) {
    for (int64_t j = 0; j < width; ++j) {
      for (int64_t k = 0; k < B; ++k) acc[j][k] += acc[j + width][k];
    }
  }
  for (int64_t k = 0; k < B; ++k) out[k] = acc[0][k] * scale;
}

// The loops over maps, once per ISA (cpu/isa.h): pooling reads maps that are usually still in
// L2, where 8-float adds are twice as fast as the baseline's 4.
// clang-format off
#define DPAR_GLOBAL_POOL_LOOPS(SUFFIX, TARGET)                                               \
  template <int64_t B, int64_t P>                                                           \
  TARGET void pool_blocks##SUFFIX(const float* x, float* y, int64_t maps, int64_t HW) {     \
    const float scale = 1.0f / static_cast<float>(HW);                                      \
    _Pragma("omp parallel for schedule(static) if (maps * HW * B > kParallelThreshold)")    \
    for (int64_t m = 0; m < maps; ++m) block_mean<B, P>(x + m * HW * B, HW, scale, y + m * B); \
  }                                                                                         \
  TARGET void pool_channels_last##SUFFIX(const float* x, float* y, int64_t N, int64_t C,    \
                                         int64_t HW) {                                      \
    const float scale = 1.0f / static_cast<float>(HW);                                      \
    _Pragma("omp parallel for schedule(static) if (N * C * HW > kParallelThreshold)")       \
    for (int64_t n = 0; n < N; ++n) {                                                       \
      std::vector<float> acc(static_cast<size_t>(C), 0.0f);                                 \
      float* a = acc.data();                                                                \
      for (int64_t p = 0; p < HW; ++p) {                                                    \
        const float* row = x + (n * HW + p) * C;                                            \
        for (int64_t c = 0; c < C; ++c) a[c] += row[c];                                     \
      }                                                                                     \
      for (int64_t c = 0; c < C; ++c) y[n * C + c] = a[c] * scale;                          \
    }                                                                                       \
  }                                                                                         \
  TARGET void pool##SUFFIX(const float* x, float* y, const Shape& d, PoolLayout layout) {   \
    const int64_t HW = d[2] * d[3];                                                         \
    if (layout.channels_last) return pool_channels_last##SUFFIX(x, y, d[0], d[1], HW);      \
    const int64_t blocks = (d[1] + layout.block - 1) / layout.block;                        \
    switch (layout.block) {                                                                 \
      case 1: return pool_blocks##SUFFIX<1, 8>(x, y, d[0] * d[1], HW);                      \
      case 8: return pool_blocks##SUFFIX<8, 4>(x, y, d[0] * blocks, HW);                    \
      default: return pool_blocks##SUFFIX<16, 4>(x, y, d[0] * blocks, HW);                  \
    }                                                                                       \
  }
DPAR_GLOBAL_POOL_LOOPS(_baseline, )
#if DPAR_HAVE_ISA_CLONES
DPAR_GLOBAL_POOL_LOOPS(_avx2, DPAR_TARGET_AVX2)
#endif
// clang-format on
#undef DPAR_GLOBAL_POOL_LOOPS

memory::desc with_tag(const memory::desc& md, const memory::dims& dims, tag t) {
  return memory::desc(dims, md.data_type(), t);
}

}  // namespace

std::optional<PoolLayout> global_pool_layout(const memory::desc& md) {
  if (md.data_type() != memory::data_type::f32 || md.data.ndims != 4) return std::nullopt;
  const memory::dims dims = md.dims();
  if (md == with_tag(md, dims, tag::nChw8c)) return PoolLayout{8, false};
  if (md == with_tag(md, dims, tag::nChw16c)) return PoolLayout{16, false};
  if (md == with_tag(md, dims, tag::nchw)) return PoolLayout{1, false};
  if (md == with_tag(md, dims, tag::nhwc)) return PoolLayout{1, true};
  return std::nullopt;
}

memory::desc global_pool_output_md(const memory::desc& input_md) {
  const PoolLayout layout = *global_pool_layout(input_md);
  const memory::dims dims = input_md.dims();
  const memory::dims out = {dims[0], dims[1], 1, 1};
  if (layout.block == 8) return with_tag(input_md, out, tag::nChw8c);
  if (layout.block == 16) return with_tag(input_md, out, tag::nChw16c);
  return with_tag(input_md, out, tag::nchw);  // [N,C,1,1]: NCHW and NHWC are the same bytes
}

void global_average_pool(const float* x, float* y, const Shape& dims, PoolLayout layout) {
#if DPAR_HAVE_ISA_CLONES
  if (cpu::cpu_isa() != cpu::Isa::baseline) return pool_avx2(x, y, dims, layout);
#endif
  pool_baseline(x, y, dims, layout);
}

}  // namespace dpar::infer::detail
