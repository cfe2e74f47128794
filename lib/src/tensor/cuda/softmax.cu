// CUDA softmax / log_softmax (forward, backward), fused cross-entropy, argmax and top-k
// indices, with the formulas of the CPU kernels (cpu/softmax_kernels.cpp). Every reduction
// runs in a fixed order (a shuffle tree per warp, then the warps in index order), so results
// do not change from run to run.
//
// A "line" is the set of elements reduced together (x viewed as [outer, dim, inner]: one line
// per (outer, inner) pair). Lines are spread over groups of G threads: one warp per line when
// lines are short, the whole block when they are long. When the reduced dim is not the
// innermost one and there are many lines (softmax over the channels of NCHW), one thread per
// line is used instead: neighbouring threads then read neighbouring addresses.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/deferred_error.h"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/softmax_kernels.h"

namespace dpar::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int64_t kMaxGrid = 65535 * 8;       // the grids loop; more blocks would only queue
constexpr int64_t kWarpLineMax = 1024;        // longest line given to one warp
constexpr int64_t kMinLinesPerThread = 1024;  // fewer lines: one thread each would idle the GPU

// ---- group reductions ------------------------------------------------------------------------

// A candidate for argmax / top-k: value and index; i < 0 means "none yet".
struct Best {
  float v;
  int64_t i;
};

__device__ __forceinline__ float shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ double shfl_xor(double v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ Best shfl_xor(Best b, int o) {
  return {__shfl_xor_sync(0xffffffffu, b.v, o),
          static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(b.i), o))};
}

// Whether (va, ia) ranks before (vb, ib): larger first, NaN above everything, equal values by
// lower index (the CPU top-k order; argmax is its first element, the CPU's first maximum with
// NaN counting as the maximum). A strict total order over distinct indices.
__device__ __forceinline__ bool ranks_before(float va, int64_t ia, float vb, int64_t ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
// fmaxf ignores NaN like the CPU's std::max(max, x): a NaN then spreads through the sum.
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Better {
  __device__ Best operator()(Best a, Best b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    return ranks_before(a.v, a.i, b.v, b.i) ? a : b;
  }
};

// Combines v over the G threads of a group; every thread of the group gets the result, bit
// for bit the same (the xor tree only swaps commutative operands between lanes). G = kThreads
// must be called by every thread of the block.
template <int G, class T, class Op>
__device__ __forceinline__ T group_reduce(T v, Op op) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, shfl_xor(v, o));
  if constexpr (G == kWarp) {
    return v;
  } else {
    static_assert(G == kThreads, "groups are a warp or the whole block");
    __shared__ T partial[kThreads / kWarp];
    __syncthreads();  // the previous reduction's readers are done with `partial`
    if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = v;
    __syncthreads();
    v = partial[0];
    for (int w = 1; w < kThreads / kWarp; ++w) v = op(v, partial[w]);
    return v;
  }
}

// Lines handled by group G: the group's first line, its stride over lines, its lane. The loop
// condition is uniform over a group, as group_reduce needs.
template <int G>
__device__ __forceinline__ int64_t first_line() {
  return blockIdx.x * static_cast<int64_t>(kThreads / G) + threadIdx.x / G;
}
template <int G>
__device__ __forceinline__ int64_t line_step() {
  return static_cast<int64_t>(gridDim.x) * (kThreads / G);
}
template <int G>
__device__ __forceinline__ int64_t lane() {
  return threadIdx.x % G;
}

template <int G>
unsigned line_grid(int64_t lines) {
  constexpr int64_t per_block = kThreads / G;
  const int64_t b = (lines + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxGrid ? kMaxGrid : b));
}

// Line l of x along dim starts at offsets(l) (x's shape with dim set to 1, size-1 dims
// dropped by make_indexer).
template <int K>
StridedIndexer<K> line_indexer(const Tensor& x, int64_t dim, const Shape* const (&strides)[K]) {
  Shape lines = x.shape();
  lines[static_cast<size_t>(dim)] = 1;
  return make_indexer<K>(lines, strides);
}

int64_t normalise_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t nd = x.dim();
  if (dim < 0) dim += nd;
  DPAR_CHECK(dim >= 0 && dim < nd, op, ": dim ", dim, " out of range for shape ", x.shape());
  return dim;
}

bool one_thread_per_line(int64_t dim_stride, int64_t lines) {
  return dim_stride != 1 && lines >= kMinLinesPerThread;
}

void check_f32(const Tensor& t, const char* op, const char* name) {
  DPAR_CHECK(t.dtype() == DType::f32, op, " on CUDA supports f32; ", name, " is ", t.dtype());
}

// ---- softmax ---------------------------------------------------------------------------------

// out = exp(x - max) / sum, or (x - max) - log(sum) for log_softmax (as on the CPU).
template <int G>
__global__ void softmax_groups(const float* x, float* out, StridedIndexer<1> ix, int64_t lines,
                               int64_t k, int64_t sd, bool log) {
  for (int64_t l = first_line<G>(); l < lines; l += line_step<G>()) {
    int64_t off[1];
    ix.offsets(l, off);
    const float* xi = x + off[0];
    float* o = out + off[0];
    float mx = -INFINITY;
    for (int64_t j = lane<G>(); j < k; j += G) mx = fmaxf(mx, xi[j * sd]);
    mx = group_reduce<G>(mx, Max{});
    float sum = 0.f;
    for (int64_t j = lane<G>(); j < k; j += G) sum += expf(xi[j * sd] - mx);
    sum = group_reduce<G>(sum, Sum{});
    if (log) {
      const float log_sum = logf(sum);
      for (int64_t j = lane<G>(); j < k; j += G) o[j * sd] = (xi[j * sd] - mx) - log_sum;
    } else {
      const float inv = 1.f / sum;
      for (int64_t j = lane<G>(); j < k; j += G) o[j * sd] = expf(xi[j * sd] - mx) * inv;
    }
  }
}

__global__ void softmax_lines(const float* x, float* out, StridedIndexer<1> ix, int64_t lines,
                              int64_t k, int64_t sd, bool log) {
  DPAR_CUDA_KERNEL_LOOP(l, lines) {
    int64_t off[1];
    ix.offsets(l, off);
    const float* xi = x + off[0];
    float* o = out + off[0];
    float mx = -INFINITY;
    for (int64_t j = 0; j < k; ++j) mx = fmaxf(mx, xi[j * sd]);
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) sum += expf(xi[j * sd] - mx);
    if (log) {
      const float log_sum = logf(sum);
      for (int64_t j = 0; j < k; ++j) o[j * sd] = (xi[j * sd] - mx) - log_sum;
    } else {
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < k; ++j) o[j * sd] = expf(xi[j * sd] - mx) * inv;
    }
  }
}

void softmax_cuda(const Tensor& x, int64_t dim, bool log, Tensor& out) {
  DeviceGuard guard(x.device());
  check_f32(x, "softmax", "x");
  check_f32(out, "softmax", "out");
  DPAR_CHECK(out.shape() == x.shape() && out.strides() == x.strides(),
             "softmax on CUDA needs out with x's shape and strides; x ", x.shape(), " strides ",
             x.strides(), ", out ", out.shape(), " strides ", out.strides());
  if (x.numel() == 0) return;
  dim = normalise_dim(x, dim, "softmax");
  const int64_t k = x.size(dim), sd = x.stride(dim), lines = x.numel() / k;
  const Shape* const strides[1] = {&x.strides()};
  const StridedIndexer<1> ix = line_indexer<1>(x, dim, strides);
  const auto* px = static_cast<const float*>(x.raw_data());
  auto* po = static_cast<float*>(out.raw_data());
  cudaStream_t stream = current_stream(x.device().index);
  if (one_thread_per_line(sd, lines)) {
    softmax_lines<<<blocks_for(lines), kThreads, 0, stream>>>(px, po, ix, lines, k, sd, log);
  } else if (k <= kWarpLineMax) {
    softmax_groups<kWarp>
        <<<line_grid<kWarp>(lines), kThreads, 0, stream>>>(px, po, ix, lines, k, sd, log);
  } else {
    softmax_groups<kThreads>
        <<<line_grid<kThreads>(lines), kThreads, 0, stream>>>(px, po, ix, lines, k, sd, log);
  }
  check_launch("softmax");
}

// softmax:     dx = y * (g - sum(g * y))
// log_softmax: dx = g - exp(y) * sum(g)
template <int G>
__global__ void softmax_backward_groups(const float* g, const float* y, float* out,
                                        StridedIndexer<1> ix, int64_t lines, int64_t k, int64_t sd,
                                        bool log) {
  for (int64_t l = first_line<G>(); l < lines; l += line_step<G>()) {
    int64_t off[1];
    ix.offsets(l, off);
    const float *gi = g + off[0], *yi = y + off[0];
    float* o = out + off[0];
    float s = 0.f;
    for (int64_t j = lane<G>(); j < k; j += G) s += log ? gi[j * sd] : gi[j * sd] * yi[j * sd];
    s = group_reduce<G>(s, Sum{});
    for (int64_t j = lane<G>(); j < k; j += G) {
      o[j * sd] = log ? gi[j * sd] - expf(yi[j * sd]) * s : yi[j * sd] * (gi[j * sd] - s);
    }
  }
}

__global__ void softmax_backward_lines(const float* g, const float* y, float* out,
                                       StridedIndexer<1> ix, int64_t lines, int64_t k, int64_t sd,
                                       bool log) {
  DPAR_CUDA_KERNEL_LOOP(l, lines) {
    int64_t off[1];
    ix.offsets(l, off);
    const float *gi = g + off[0], *yi = y + off[0];
    float* o = out + off[0];
    float s = 0.f;
    for (int64_t j = 0; j < k; ++j) s += log ? gi[j * sd] : gi[j * sd] * yi[j * sd];
    for (int64_t j = 0; j < k; ++j) {
      o[j * sd] = log ? gi[j * sd] - expf(yi[j * sd]) * s : yi[j * sd] * (gi[j * sd] - s);
    }
  }
}

void softmax_backward_cuda(const Tensor& grad, const Tensor& y, int64_t dim, bool log,
                           Tensor& grad_in) {
  DeviceGuard guard(y.device());
  check_f32(grad, "softmax_backward", "grad");
  check_f32(y, "softmax_backward", "y");
  check_f32(grad_in, "softmax_backward", "grad_in");
  DPAR_CHECK(grad.shape() == y.shape() && grad_in.shape() == y.shape() &&
                 grad.strides() == y.strides() && grad_in.strides() == y.strides(),
             "softmax_backward on CUDA needs grad, y and grad_in of one shape and strides; got ",
             grad.shape(), "/", grad.strides(), ", ", y.shape(), "/", y.strides(), ", ",
             grad_in.shape(), "/", grad_in.strides());
  if (y.numel() == 0) return;
  dim = normalise_dim(y, dim, "softmax_backward");
  const int64_t k = y.size(dim), sd = y.stride(dim), lines = y.numel() / k;
  const Shape* const strides[1] = {&y.strides()};
  const StridedIndexer<1> ix = line_indexer<1>(y, dim, strides);
  const auto* pg = static_cast<const float*>(grad.raw_data());
  const auto* py = static_cast<const float*>(y.raw_data());
  auto* po = static_cast<float*>(grad_in.raw_data());
  cudaStream_t stream = current_stream(y.device().index);
  if (one_thread_per_line(sd, lines)) {
    softmax_backward_lines<<<blocks_for(lines), kThreads, 0, stream>>>(pg, py, po, ix, lines, k, sd,
                                                                       log);
  } else if (k <= kWarpLineMax) {
    softmax_backward_groups<kWarp>
        <<<line_grid<kWarp>(lines), kThreads, 0, stream>>>(pg, py, po, ix, lines, k, sd, log);
  } else {
    softmax_backward_groups<kThreads>
        <<<line_grid<kThreads>(lines), kThreads, 0, stream>>>(pg, py, po, ix, lines, k, sd, log);
  }
  check_launch("softmax_backward");
}

// ---- cross-entropy ---------------------------------------------------------------------------

// Per row, as on the CPU (sums of exp and of logits in double):
// loss_i = (1-eps) * (lse_i - z_i[t_i]) + eps * (lse_i - mean_k z_ik)
// d loss / d z_ik = (softmax_ik - eps/K - (1-eps) [k == t_i]) / N.
// A target outside [0, K) is reported (deferred error) and gives a NaN loss and gradient row.
template <int G>
__global__ void cross_entropy_rows(const float* z, int64_t rs, int64_t cs, const int64_t* target,
                                   int64_t ts, int64_t n, int64_t k, double eps, float* grad,
                                   double* row_loss, DeferredError* err) {
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t i = first_line<G>(); i < n; i += line_step<G>()) {
    const float* zi = z + i * rs;
    float* g = grad ? grad + i * k : nullptr;
    const int64_t t = target[i * ts];
    if (t < 0 || t >= k) {  // the same for the whole group: no reduction is skipped by half
      if (lane<G>() == 0) {
        report_error(err, kCrossEntropyTargetOutOfRange, t, k);
        row_loss[i] = NAN;
      }
      if (g) {
        for (int64_t j = lane<G>(); j < k; j += G) g[j] = NAN;
      }
      continue;
    }
    float mx = -INFINITY;
    for (int64_t j = lane<G>(); j < k; j += G) mx = fmaxf(mx, zi[j * cs]);
    mx = group_reduce<G>(mx, Max{});
    double sum = 0.0, zsum = 0.0;
    for (int64_t j = lane<G>(); j < k; j += G) {
      const float v = zi[j * cs];
      sum += exp(static_cast<double>(v - mx));
      zsum += v;
    }
    sum = group_reduce<G>(sum, Sum{});
    zsum = group_reduce<G>(zsum, Sum{});
    const double lse = mx + log(sum);
    if (lane<G>() == 0) {
      row_loss[i] = (1.0 - eps) * (lse - zi[t * cs]) + eps * (lse - zsum / static_cast<double>(k));
    }
    if (g) {
      const double off = eps / static_cast<double>(k);
      for (int64_t j = lane<G>(); j < k; j += G) {
        double d = exp(static_cast<double>(zi[j * cs]) - lse) - off;
        if (j == t) d -= 1.0 - eps;
        g[j] = static_cast<float>(d * inv_n);
      }
    }
  }
}

// loss = mean of the row losses, summed by one block in a fixed order (no atomics).
__global__ void mean_of_rows(const double* row_loss, int64_t n, float* loss) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += row_loss[i];
  s = group_reduce<kThreads>(s, Sum{});
  if (threadIdx.x == 0) *loss = static_cast<float>(s * (1.0 / static_cast<double>(n)));
}

void cross_entropy_cuda(const Tensor& logits, const Tensor& target, double label_smoothing,
                        Tensor& loss, Tensor& grad) {
  DeviceGuard guard(logits.device());
  check_f32(logits, "cross_entropy", "logits");
  check_f32(loss, "cross_entropy", "loss");
  DPAR_CHECK(logits.dim() == 2, "cross_entropy on CUDA needs logits [N,K], got ", logits.shape());
  const int64_t n = logits.size(0), k = logits.size(1);
  DPAR_CHECK(target.dtype() == DType::i64 && target.dim() == 1 && target.size(0) == n,
             "cross_entropy on CUDA needs an i64 target [", n, "], got ", target.dtype(), " ",
             target.shape());
  DPAR_CHECK(loss.numel() == 1, "cross_entropy: loss must have one element, got ", loss.shape());
  if (grad.defined()) {
    check_f32(grad, "cross_entropy", "grad");
    DPAR_CHECK(grad.shape() == logits.shape() && grad.is_contiguous(),
               "cross_entropy on CUDA needs a contiguous grad ", logits.shape(), ", got ",
               grad.shape(), " strides ", grad.strides());
  }
  const Device device = logits.device();
  cudaStream_t stream = current_stream(device.index);
  // Row losses in double, as on the CPU. There is no f64 dtype: an i64 buffer of the same
  // size holds them.
  Tensor row_loss = Tensor::empty({n}, DType::i64, device);
  auto* pl = static_cast<double*>(row_loss.raw_data());
  if (n > 0) {
    const auto* pz = static_cast<const float*>(logits.raw_data());
    const auto* pt = static_cast<const int64_t*>(target.raw_data());
    float* pg = grad.defined() ? static_cast<float*>(grad.raw_data()) : nullptr;
    DeferredError* err = deferred_error_record(device.index);
    const int64_t rs = logits.stride(0), cs = logits.stride(1), ts = target.stride(0);
    if (k <= kWarpLineMax) {
      cross_entropy_rows<kWarp><<<line_grid<kWarp>(n), kThreads, 0, stream>>>(
          pz, rs, cs, pt, ts, n, k, label_smoothing, pg, pl, err);
    } else {
      cross_entropy_rows<kThreads><<<line_grid<kThreads>(n), kThreads, 0, stream>>>(
          pz, rs, cs, pt, ts, n, k, label_smoothing, pg, pl, err);
    }
    check_launch("cross_entropy");
  }
  // Also for N = 0: the CPU's mean of nothing is 0 * (1/0) = NaN, and loss must be written.
  mean_of_rows<<<1, kThreads, 0, stream>>>(pl, n, static_cast<float*>(loss.raw_data()));
  check_launch("cross_entropy");
}

// ---- argmax, top-k ---------------------------------------------------------------------------

template <int G>
__global__ void argmax_groups(const float* x, int64_t* out, StridedIndexer<2> ix, int64_t lines,
                              int64_t k, int64_t sd) {
  for (int64_t l = first_line<G>(); l < lines; l += line_step<G>()) {
    int64_t off[2];
    ix.offsets(l, off);
    const float* xi = x + off[0];
    Best b{0.f, -1};
    for (int64_t j = lane<G>(); j < k; j += G) b = Better{}(b, Best{xi[j * sd], j});
    b = group_reduce<G>(b, Better{});
    if (lane<G>() == 0) out[off[1]] = b.i;
  }
}

__global__ void argmax_lines(const float* x, int64_t* out, StridedIndexer<2> ix, int64_t lines,
                             int64_t k, int64_t sd) {
  DPAR_CUDA_KERNEL_LOOP(l, lines) {
    int64_t off[2];
    ix.offsets(l, off);
    const float* xi = x + off[0];
    Best b{0.f, -1};
    for (int64_t j = 0; j < k; ++j) b = Better{}(b, Best{xi[j * sd], j});
    out[off[1]] = b.i;
  }
}

void argmax_cuda(const Tensor& x, int64_t dim, Tensor& out) {
  DeviceGuard guard(x.device());
  check_f32(x, "argmax", "x");
  DPAR_CHECK(out.dtype() == DType::i64, "argmax on CUDA writes i64 indices; out is ", out.dtype());
  dim = normalise_dim(x, dim, "argmax");
  DPAR_CHECK(out.dim() == x.dim() - 1, "argmax: out must have x's shape ", x.shape(),
             " without dim ", dim, ", got ", out.shape());
  if (x.numel() == 0 || out.numel() == 0) return;
  // out's strides spread over x's dims, 0 along dim (as the CPU kernel does).
  Shape out_strides(x.shape().size(), 0);
  for (size_t d = 0, o = 0; d < out_strides.size(); ++d) {
    if (static_cast<int64_t>(d) != dim) out_strides[d] = out.strides()[o++];
  }
  const int64_t k = x.size(dim), sd = x.stride(dim), lines = x.numel() / k;
  const Shape* const strides[2] = {&x.strides(), &out_strides};
  const StridedIndexer<2> ix = line_indexer<2>(x, dim, strides);
  const auto* px = static_cast<const float*>(x.raw_data());
  auto* po = static_cast<int64_t*>(out.raw_data());
  cudaStream_t stream = current_stream(x.device().index);
  if (one_thread_per_line(sd, lines)) {
    argmax_lines<<<blocks_for(lines), kThreads, 0, stream>>>(px, po, ix, lines, k, sd);
  } else if (k <= kWarpLineMax) {
    argmax_groups<kWarp>
        <<<line_grid<kWarp>(lines), kThreads, 0, stream>>>(px, po, ix, lines, k, sd);
  } else {
    argmax_groups<kThreads>
        <<<line_grid<kThreads>(lines), kThreads, 0, stream>>>(px, po, ix, lines, k, sd);
  }
  check_launch("argmax");
}

// k passes over each row: pass p picks the best entry ranking after pick p-1. The order is a
// strict total order, so "after the previous pick" excludes exactly the entries picked so far
// and no list of picked indices is needed.
template <int G>
__global__ void topk_groups(const float* x, int64_t rs, int64_t cs, int64_t n, int64_t cols,
                            int64_t k, int64_t* out) {
  for (int64_t i = first_line<G>(); i < n; i += line_step<G>()) {
    const float* row = x + i * rs;
    Best prev{0.f, -1};
    for (int64_t p = 0; p < k; ++p) {
      Best b{0.f, -1};
      for (int64_t j = lane<G>(); j < cols; j += G) {
        const float v = row[j * cs];
        if (prev.i < 0 || ranks_before(prev.v, prev.i, v, j)) b = Better{}(b, Best{v, j});
      }
      b = group_reduce<G>(b, Better{});
      if (lane<G>() == 0) out[i * k + p] = b.i;
      prev = b;
    }
  }
}

void topk_indices_cuda(const Tensor& x, int64_t k, Tensor& out) {
  DeviceGuard guard(x.device());
  check_f32(x, "topk_indices", "x");
  DPAR_CHECK(x.dim() == 2, "topk_indices on CUDA needs x [N,K], got ", x.shape());
  const int64_t n = x.size(0), cols = x.size(1);
  DPAR_CHECK(k >= 0 && k <= cols, "topk_indices: k = ", k, " out of range for rows of ", cols);
  DPAR_CHECK(out.dtype() == DType::i64 && out.dim() == 2 && out.size(0) == n && out.size(1) == k &&
                 out.is_contiguous(),
             "topk_indices on CUDA needs a contiguous i64 out [", n, ",", k, "], got ", out.dtype(),
             " ", out.shape(), " strides ", out.strides());
  if (n == 0 || k == 0) return;
  const auto* px = static_cast<const float*>(x.raw_data());
  auto* po = static_cast<int64_t*>(out.raw_data());
  const int64_t rs = x.stride(0), cs = x.stride(1);
  cudaStream_t stream = current_stream(x.device().index);
  if (cols <= kWarpLineMax) {
    topk_groups<kWarp><<<line_grid<kWarp>(n), kThreads, 0, stream>>>(px, rs, cs, n, cols, k, po);
  } else {
    topk_groups<kThreads>
        <<<line_grid<kThreads>(n), kThreads, 0, stream>>>(px, rs, cs, n, cols, k, po);
  }
  check_launch("topk_indices");
}

}  // namespace

void register_softmax_kernels() {
  kernels::softmax.set(DeviceType::CUDA, &softmax_cuda);
  kernels::softmax_backward.set(DeviceType::CUDA, &softmax_backward_cuda);
  kernels::cross_entropy.set(DeviceType::CUDA, &cross_entropy_cuda);
  kernels::argmax.set(DeviceType::CUDA, &argmax_cuda);
  kernels::topk_indices.set(DeviceType::CUDA, &topk_indices_cuda);
}

}  // namespace dpar::cuda
