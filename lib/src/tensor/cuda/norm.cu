// CUDA batch normalisation (forward, backward from the input or from the output, running
// statistics update) on 4-D tensors that are contiguous (NCHW) or channels-last (NHWC).
//
// Every per-channel reduction runs in two deterministic steps, without float atomics:
//   1. a grid of blocks, each summing a fixed chunk of one channel (NCHW: blocks (channel,
//      chunk)) or of 32 channels (NHWC: threads across channels, so a warp reads one row's 32
//      neighbouring channels, blocks down chunks of rows), writes (sum a, sum b) per
//      (channel, chunk) into a small temporary;
//   2. one warp per channel adds its chunks (lane l the chunks l, l+32, ... in order, then a
//      fixed shuffle tree) and derives the per-channel coefficients the elementwise kernel
//      applies. (A thread per channel walking up to 1024 chunks was latency-bound: on an H100
//      it took 34-46 us a launch, more than the data passes themselves.)
// Sums are accumulated in double: the batch variance is E[x^2] - mean^2, which double keeps
// exact enough for any f32 data (and it matches the CPU's double sums in the backward).
// x, y, dy and dx may be f16/bf16 (amp::Autocast's half-precision activations, as cuDNN's
// batch norm takes them): they are read into f32, and the statistics, the parameters and
// their gradients stay f32.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/float_types.cuh"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/nn_kernels.h"

namespace dpar::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // NHWC step 1: 32 channels x 8 rows
constexpr int64_t kTargetBlocks = 1024;          // enough to fill an H100 several times over
constexpr int64_t kMaxSplits = 65535;            // gridDim.y limit

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A 4-D batch-norm operand; flat index i is the memory position of element (n, c, p = h*W+w):
// NCHW i = (n*C + c)*HW + p, NHWC i = (n*HW + p)*C + c.
struct BnLayout {
  int64_t N, C, HW;
  bool nhwc;
  int64_t count() const { return N * HW; }  // elements per channel
  int64_t numel() const { return N * C * HW; }
};

BnLayout bn_layout(const Tensor& x, const char* op) {
  DPAR_CHECK(x.dim() == 4, op, " on CUDA needs a 4-D tensor, got shape ", x.shape());
  DPAR_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f16 || x.dtype() == DType::bf16, op,
             " on CUDA supports f32, f16 and bf16, got ", x.dtype());
  // When both predicates hold (C == 1 or H*W == 1) the two index maps above coincide.
  const bool nhwc = x.is_contiguous(MemoryFormat::ChannelsLast);
  DPAR_CHECK(nhwc || x.is_contiguous(), op,
             " on CUDA needs a contiguous or channels-last tensor, got shape ", x.shape(),
             " strides ", x.strides());
  return {x.size(0), x.size(1), x.size(2) * x.size(3), nhwc};
}

// t must be a tensor of like's dtype and shape in the layout L was taken from.
void check_like(const Tensor& t, const Tensor& like, const BnLayout& L, const char* op,
                const char* name) {
  DPAR_CHECK(t.defined() && t.dtype() == like.dtype() && t.shape() == like.shape() &&
                 t.is_contiguous(L.nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous),
             op, " on CUDA: ", name, " must be ", like.dtype(), " ", like.shape(),
             " in the layout of strides ", like.strides(), "; got ",
             t.defined() ? t.str() : "undefined", " strides ", t.defined() ? t.strides() : Shape{});
}

// Per-channel vectors: weight/bias/dweight/dbias contiguous [C] (or undefined where allowed),
// mean/var/running statistics [C] with any stride (read through stride(0)).
void check_channels(const Tensor& t, int64_t C, bool contiguous, const char* op, const char* name) {
  DPAR_CHECK(t.dtype() == DType::f32 && t.dim() == 1 && t.size(0) == C &&
                 (!contiguous || t.is_contiguous()),
             op, " on CUDA: ", name, " must be f32 [", C, "]", contiguous ? " contiguous" : "",
             "; got ", t.str(), " strides ", t.strides());
}

const float* f32_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const float*>(t.raw_data()) : nullptr;
}
float* f32_mut_or_null(const Tensor& t) {
  return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr;
}

// ---- step 1: per-(channel, chunk) sums -------------------------------------------------------

struct Sums2 {
  double a, b;
};

// Forward: (x, x^2).
template <class T>
struct MomentSums {
  const T* x;
  __device__ Sums2 operator()(int64_t i, int64_t) const {
    const double v = to_float(x[i]);
    return {v, v * v};
  }
};

// Backward: (dy, dy * x_hat) with x_hat = (x - mean) * inv_std; coef from bn_backward_coef.
template <class T>
struct GradSums {
  const T* src;
  const T* dz;
  const float* coef;
  int64_t C;
  __device__ Sums2 operator()(int64_t i, int64_t c) const {
    const float v = to_float(src[i]);
    const float dy = to_float(dz[i]);
    const float xh = (v - coef[c]) * coef[C + c];
    return {static_cast<double>(dy), static_cast<double>(dy * xh)};
  }
};

// Block (c, s) sums elements [s*chunk, (s+1)*chunk) of channel c in NCHW (element m = n*HW+p).
// (n, p) advance by a fixed step instead of dividing per element.
template <class Op>
__global__ void channel_sums_nchw(Op op, int64_t C, int64_t HW, int64_t M, int64_t chunk,
                                  double* partial) {
  const int64_t c = blockIdx.x, s = blockIdx.y;
  const int64_t begin = s * chunk, end = begin + chunk < M ? begin + chunk : M;
  double a = 0.0, b = 0.0;
  int64_t m = begin + threadIdx.x;
  if (m < end) {
    int64_t n = m / HW, p = m - n * HW;
    const int64_t dn = kThreads / HW, dp = kThreads % HW;
    for (; m < end; m += kThreads) {
      const Sums2 v = op((n * C + c) * HW + p, c);
      a += v.a;
      b += v.b;
      n += dn;
      p += dp;
      if (p >= HW) {
        p -= HW;
        ++n;
      }
    }
  }
  // Warp trees, then the warps in order by thread 0: a fixed order.
  for (int o = kWarp / 2; o > 0; o /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  __shared__ double warp_sums[kThreads / kWarp][2];
  if (threadIdx.x % kWarp == 0) {
    warp_sums[threadIdx.x / kWarp][0] = a;
    warp_sums[threadIdx.x / kWarp][1] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / kWarp; ++w) {
      a += warp_sums[w][0];
      b += warp_sums[w][1];
    }
    partial[(c * gridDim.y + s) * 2] = a;
    partial[(c * gridDim.y + s) * 2 + 1] = b;
  }
}

// Block (t, s), threads (x: channel in tile t, y: row lane) sums rows [s*chunk, (s+1)*chunk)
// of NHWC viewed as [R = N*HW, C]; a warp reads 32 neighbouring channels of one row.
template <class Op>
__global__ void channel_sums_nhwc(Op op, int64_t C, int64_t R, int64_t chunk, double* partial) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kWarp) + threadIdx.x;
  const int64_t s = blockIdx.y;
  const int64_t begin = s * chunk, end = begin + chunk < R ? begin + chunk : R;
  double a = 0.0, b = 0.0;
  if (c < C) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowsPerBlock) {
      const Sums2 v = op(r * C + c, c);
      a += v.a;
      b += v.b;
    }
  }
  __shared__ double row_sums[kRowsPerBlock][kWarp][2];
  row_sums[threadIdx.y][threadIdx.x][0] = a;
  row_sums[threadIdx.y][threadIdx.x][1] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int w = 1; w < kRowsPerBlock; ++w) {
      a += row_sums[w][threadIdx.x][0];
      b += row_sums[w][threadIdx.x][1];
    }
    partial[(c * gridDim.y + s) * 2] = a;
    partial[(c * gridDim.y + s) * 2 + 1] = b;
  }
}

// Runs step 1 for op over L; returns the temporary holding (a, b) for each (channel, split):
// partial[(c * splits + s) * 2 + {0, 1}].
template <class Op>
Tensor channel_sums(const Op& op, const BnLayout& L, Device device, cudaStream_t stream,
                    const char* name, int64_t& splits) {
  const int64_t rows = L.count();  // NHWC: rows of C channels; NCHW: elements of one channel
  const int64_t tiles = L.nhwc ? ceil_div(L.C, kWarp) : L.C;
  const int64_t min_chunk = L.nhwc ? 256 : 4096;  // rows / elements per block at least
  splits =
      std::max<int64_t>(1, std::min(ceil_div(rows, min_chunk), ceil_div(kTargetBlocks, tiles)));
  splits = std::min(splits, kMaxSplits);
  const int64_t chunk = ceil_div(rows, splits);
  splits = ceil_div(rows, chunk);  // no empty chunk
  // Sums in double; there is no f64 dtype, an i64 buffer of the same size holds them.
  Tensor partial = Tensor::empty({L.C * splits * 2}, DType::i64, device);
  auto* pp = static_cast<double*>(partial.raw_data());
  if (L.nhwc) {
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
    channel_sums_nhwc<<<grid, dim3(kWarp, kRowsPerBlock), 0, stream>>>(op, L.C, rows, chunk, pp);
  } else {
    const dim3 grid(static_cast<unsigned>(L.C), static_cast<unsigned>(splits));
    channel_sums_nchw<<<grid, kThreads, 0, stream>>>(op, L.C, L.HW, rows, chunk, pp);
  }
  check_launch(name);
  return partial;
}

// Step 2 helper, called by all 32 lanes of a warp: channel c's sums over its chunks, lane l
// adding chunks l, l+32, ... in order, then the lanes in a fixed tree. Valid in lane 0.
__device__ __forceinline__ Sums2 warp_add_chunks(const double* partial, int64_t c, int64_t splits,
                                                 int lane) {
  Sums2 t{0.0, 0.0};
  for (int64_t s = lane; s < splits; s += kWarp) {
    t.a += partial[(c * splits + s) * 2];
    t.b += partial[(c * splits + s) * 2 + 1];
  }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    t.a += __shfl_down_sync(0xffffffffu, t.a, o);
    t.b += __shfl_down_sync(0xffffffffu, t.b, o);
  }
  return t;
}

// Step 2 kernels run one warp per channel: c = global_warp(), c += warp_count(). The channel
// loop depends on the warp only, so all 32 lanes reach warp_add_chunks' shuffles together.
__device__ __forceinline__ int64_t global_warp() {
  return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
}
__device__ __forceinline__ int64_t warp_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
}
unsigned warp_per_channel_blocks(int64_t C) { return blocks_for(C * kWarp); }

// ---- forward ---------------------------------------------------------------------------------

// coef = [scale = weight / sqrt(var + eps), mean, bias], per channel. With batch statistics
// the mean and biased variance come from the sums and are written to mean/var.
__global__ void bn_forward_coef(const double* partial, int64_t splits, double count, int64_t C,
                                float* mean, int64_t ms, float* var, int64_t vs, const float* w,
                                const float* b, float eps, float* coef) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t c = global_warp(); c < C; c += warp_count()) {
    const Sums2 t = partial ? warp_add_chunks(partial, c, splits, lane) : Sums2{0.0, 0.0};
    if (lane != 0) continue;
    float mu, v;
    if (partial) {
      const double dm = t.a / count;
      const double dv = t.b / count - dm * dm;
      mu = static_cast<float>(dm);
      v = static_cast<float>(dv > 0.0 ? dv : 0.0);  // rounding can leave a tiny negative
      mean[c * ms] = mu;
      var[c * vs] = v;
    } else {
      mu = mean[c * ms];
      v = var[c * vs];
    }
    coef[c] = (w ? w[c] : 1.f) * (1.f / sqrtf(v + eps));
    coef[C + c] = mu;
    coef[2 * C + c] = b ? b[c] : 0.f;
  }
}

// Runs f(i, channel of i) for every flat element of L, with 32-bit index arithmetic when the
// tensor allows it (the channel's division is most of the work of these memory-bound kernels).
template <bool kNhwc, class Idx, class F>
__global__ void channel_elementwise(F f, Idx n, Idx C, Idx HW) {
  for (Idx i = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<Idx>(blockDim.x) * gridDim.x) {
    f(i, kNhwc ? i % C : (i / HW) % C);
  }
}

template <class F>
void launch_channel_elementwise(const F& f, const BnLayout& L, cudaStream_t stream) {
  const int64_t n = L.numel();
  const unsigned grid = blocks_for(n);
  if (n <= INT32_MAX) {
    const auto n32 = static_cast<uint32_t>(n), c32 = static_cast<uint32_t>(L.C),
               hw32 = static_cast<uint32_t>(L.HW);
    if (L.nhwc) {
      channel_elementwise<true><<<grid, kThreads, 0, stream>>>(f, n32, c32, hw32);
    } else {
      channel_elementwise<false><<<grid, kThreads, 0, stream>>>(f, n32, c32, hw32);
    }
  } else if (L.nhwc) {
    channel_elementwise<true><<<grid, kThreads, 0, stream>>>(f, n, L.C, L.HW);
  } else {
    channel_elementwise<false><<<grid, kThreads, 0, stream>>>(f, n, L.C, L.HW);
  }
}

// y = scale * (x - mean) + bias (oneDNN's formula), coef as in bn_forward_coef.
template <class T>
struct ForwardApply {
  const T* x;
  T* y;
  const float* coef;
  int64_t C;
  template <class Idx>
  __device__ void operator()(Idx i, Idx c) const {
    y[i] = from_float<T>(coef[c] * (to_float(x[i]) - coef[C + c]) + coef[2 * C + c]);
  }
};

template <class T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& mean,
                   Tensor& var, bool use_batch_stats, double eps, Tensor& y, const BnLayout& L,
                   cudaStream_t stream) {
  constexpr const char* op = "batch_norm_forward";
  const Device device = x.device();
  const T* px = data_as<T>(x);
  Tensor partial;
  int64_t splits = 0;
  if (use_batch_stats) partial = channel_sums(MomentSums<T>{px}, L, device, stream, op, splits);
  Tensor coef = Tensor::empty({3 * L.C}, DType::f32, device);
  auto* pc = static_cast<float*>(coef.raw_data());
  bn_forward_coef<<<warp_per_channel_blocks(L.C), kThreads, 0, stream>>>(
      use_batch_stats ? static_cast<const double*>(partial.raw_data()) : nullptr, splits,
      static_cast<double>(L.count()), L.C, static_cast<float*>(mean.raw_data()), mean.stride(0),
      static_cast<float*>(var.raw_data()), var.stride(0), f32_or_null(weight), f32_or_null(bias),
      static_cast<float>(eps), pc);
  check_launch(op);
  launch_channel_elementwise(ForwardApply<T>{px, data_as<T>(y), pc, L.C}, L, stream);
  check_launch(op);
}

void batch_norm_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             Tensor& mean, Tensor& var, bool use_batch_stats,
                             bool /*need_backward: the backward needs nothing extra*/, double eps,
                             Tensor& y) {
  DeviceGuard guard(x.device());
  constexpr const char* op = "batch_norm_forward";
  const BnLayout L = bn_layout(x, op);
  check_like(y, x, L, op, "y");
  if (weight.defined()) check_channels(weight, L.C, true, op, "weight");
  if (bias.defined()) check_channels(bias, L.C, true, op, "bias");
  check_channels(mean, L.C, false, op, "mean");
  check_channels(var, L.C, false, op, "var");
  if (L.numel() == 0) return;
  const Device device = x.device();
  cudaStream_t stream = current_stream(device.index);
  visit_float_dtype(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_typed<T>(x, weight, bias, mean, var, use_batch_stats, eps, y, L, stream);
  });
}

// ---- backward --------------------------------------------------------------------------------

// coef layout for the backward: [mean, inv_std, gain, mean_dy, mean_dy_xhat] per channel;
// x_hat = (x - mean) * inv_std, dx = gain * (dy - mean_dy - x_hat * mean_dy_xhat) with
// gain = weight * inv_std. (The backward from the output, which the CPU uses to free the input,
// needs a host check of the weights; on a GPU the input is kept instead: see ops_norm.cpp.)
__global__ void bn_backward_coef(int64_t C, const float* mean, int64_t ms, const float* var,
                                 int64_t vs, const float* w, float eps, float* coef) {
  DPAR_CUDA_KERNEL_LOOP(c, C) {
    const float scale = w ? w[c] : 1.f;
    const float inv_std = 1.f / sqrtf(var[c * vs] + eps);
    coef[c] = mean[c * ms];
    coef[C + c] = inv_std;
    coef[2 * C + c] = scale * inv_std;
  }
}

// dbias = sum dy, dweight = sum dy * x_hat; with batch statistics the mean and variance
// depend on x too, which subtracts the means of both from dy (constants otherwise).
__global__ void bn_backward_finish(const double* partial, int64_t splits, double count, int64_t C,
                                   bool use_batch_stats, float* dweight, float* dbias,
                                   float* coef) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t c = global_warp(); c < C; c += warp_count()) {
    const Sums2 t = warp_add_chunks(partial, c, splits, lane);
    if (lane != 0) continue;
    if (dweight) dweight[c] = static_cast<float>(t.b);
    if (dbias) dbias[c] = static_cast<float>(t.a);
    coef[3 * C + c] = use_batch_stats ? static_cast<float>(t.a / count) : 0.f;
    coef[4 * C + c] = use_batch_stats ? static_cast<float>(t.b / count) : 0.f;
  }
}

// dx = gain * (dy - mean_dy - x_hat * mean_dy_xhat).
template <class T>
struct BackwardApply {
  const T* src;
  const T* dz;
  T* dx;
  const float* coef;
  int64_t C;
  template <class Idx>
  __device__ void operator()(Idx i, Idx c) const {
    const float v = to_float(src[i]);
    const float xh = (v - coef[c]) * coef[C + c];
    dx[i] =
        from_float<T>(coef[2 * C + c] * (to_float(dz[i]) - coef[3 * C + c] - xh * coef[4 * C + c]));
  }
};

void check_param_grads(const Tensor& weight, const Tensor& bias, const Tensor& dweight,
                       const Tensor& dbias, int64_t C, const char* op) {
  if (weight.defined()) check_channels(weight, C, true, op, "weight");
  if (bias.defined()) check_channels(bias, C, true, op, "bias");
  DPAR_CHECK(dweight.defined() == weight.defined() && dbias.defined() == bias.defined(), op,
             ": dweight/dbias must be given exactly when weight/bias are");
  if (dweight.defined()) check_channels(dweight, C, true, op, "dweight");
  if (dbias.defined()) check_channels(dbias, C, true, op, "dbias");
}

void batch_norm_backward_cuda(const Tensor& x, const Tensor& dy, const Tensor& weight,
                              const Tensor& bias, const Tensor& mean, const Tensor& var,
                              bool use_batch_stats, double eps, Tensor& dx, Tensor& dweight,
                              Tensor& dbias) {
  DeviceGuard guard(x.device());
  constexpr const char* op = "batch_norm_backward";
  const BnLayout L = bn_layout(x, op);
  check_like(dy, x, L, op, "dy");
  check_like(dx, x, L, op, "dx");
  check_channels(mean, L.C, false, op, "mean");
  check_channels(var, L.C, false, op, "var");
  check_param_grads(weight, bias, dweight, dbias, L.C, op);
  if (L.numel() == 0) return;
  // coef, then the per-channel sums of (dy, dy * x_hat), then the finish, then dx.
  const Device device = x.device();
  cudaStream_t stream = current_stream(device.index);
  Tensor coef = Tensor::empty({5 * L.C}, DType::f32, device);
  auto* pc = static_cast<float*>(coef.raw_data());
  bn_backward_coef<<<blocks_for(L.C), kThreads, 0, stream>>>(
      L.C, static_cast<const float*>(mean.raw_data()), mean.stride(0),
      static_cast<const float*>(var.raw_data()), var.stride(0), f32_or_null(weight),
      static_cast<float>(eps), pc);
  check_launch(op);
  visit_float_dtype(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = data_as<T>(x);
    const T* pd = data_as<T>(dy);
    int64_t splits = 0;
    const Tensor partial =
        channel_sums(GradSums<T>{px, pd, pc, L.C}, L, device, stream, op, splits);
    bn_backward_finish<<<warp_per_channel_blocks(L.C), kThreads, 0, stream>>>(
        static_cast<const double*>(partial.raw_data()), splits, static_cast<double>(L.count()), L.C,
        use_batch_stats, f32_mut_or_null(dweight), f32_mut_or_null(dbias), pc);
    check_launch(op);
    launch_channel_elementwise(BackwardApply<T>{px, pd, data_as<T>(dx), pc, L.C}, L, stream);
    check_launch(op);
  });
}

// ---- running statistics ----------------------------------------------------------------------

// running = (1-momentum)*running + momentum*batch, the variance made unbiased (in double, as
// on the CPU).
__global__ void bn_update_stats(float* rm, int64_t sm, float* rv, int64_t sv, const float* bm,
                                int64_t sbm, const float* bv, int64_t sbv, int64_t C,
                                double momentum, double unbias) {
  DPAR_CUDA_KERNEL_LOOP(c, C) {
    rm[c * sm] = static_cast<float>((1.0 - momentum) * rm[c * sm] + momentum * bm[c * sbm]);
    rv[c * sv] =
        static_cast<float>((1.0 - momentum) * rv[c * sv] + momentum * bv[c * sbv] * unbias);
  }
}

void batch_norm_update_stats_cuda(Tensor& running_mean, Tensor& running_var,
                                  const Tensor& batch_mean, const Tensor& batch_var,
                                  double momentum, int64_t count) {
  DeviceGuard guard(running_mean.device());
  constexpr const char* op = "batch_norm_update_stats";
  DPAR_CHECK(running_mean.dim() == 1, op, ": running_mean must be 1-D, got ", running_mean.shape());
  const int64_t C = running_mean.size(0);
  check_channels(running_var, C, false, op, "running_var");
  check_channels(running_mean, C, false, op, "running_mean");
  check_channels(batch_mean, C, false, op, "batch_mean");
  check_channels(batch_var, C, false, op, "batch_var");
  if (C == 0) return;
  // count == 1 gives inf, as on the CPU (the op rejects it when training).
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  bn_update_stats<<<blocks_for(C), kThreads, 0, current_stream(running_mean.device().index)>>>(
      static_cast<float*>(running_mean.raw_data()), running_mean.stride(0),
      static_cast<float*>(running_var.raw_data()), running_var.stride(0),
      static_cast<const float*>(batch_mean.raw_data()), batch_mean.stride(0),
      static_cast<const float*>(batch_var.raw_data()), batch_var.stride(0), C, momentum, unbias);
  check_launch(op);
}

}  // namespace

void register_norm_kernels() {
  kernels::batch_norm_forward.set(DeviceType::CUDA, &batch_norm_forward_cuda);
  kernels::batch_norm_backward.set(DeviceType::CUDA, &batch_norm_backward_cuda);
  kernels::batch_norm_update_stats.set(DeviceType::CUDA, &batch_norm_update_stats_cuda);
}

}  // namespace dpar::cuda
