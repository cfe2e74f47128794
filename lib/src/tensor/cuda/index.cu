// CUDA kernels for where, comparisons, gather / scatter_add and max/min over a dim (f32 values,
// i64 indices, u8 conditions). An index outside its range is a deferred error (it does not stop
// the stream; the next synchronisation throws) and reads or writes nothing.
#include <cstdint>

#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/deferred_error.h"
#include "tensor/cuda/strided_indexer.cuh"
#include "tensor/index_kernels.h"

namespace dpar::cuda {
namespace {

using kernels::CompareOp;

template <CompareOp Op>
__device__ __forceinline__ uint8_t compare_one(float x, float y) {
  if constexpr (Op == CompareOp::eq) {
    return x == y;
  } else if constexpr (Op == CompareOp::ne) {
    return x != y;
  } else if constexpr (Op == CompareOp::lt) {
    return x < y;
  } else if constexpr (Op == CompareOp::le) {
    return x <= y;
  } else if constexpr (Op == CompareOp::gt) {
    return x > y;
  } else {
    return x >= y;
  }
}

template <CompareOp Op>
__global__ void compare_kernel(const float* a, const float* b, uint8_t* out, StridedIndexer<3> ix,
                               int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = compare_one<Op>(a[off[1]], b[off[2]]);
  }
}

void compare_cuda(CompareOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  DeviceGuard guard(out.device());
  const int64_t n = out.numel();
  if (n == 0) return;
  const Shape* strides[3] = {&out.strides(), &a.strides(), &b.strides()};
  const StridedIndexer<3> ix = make_indexer<3>(out.shape(), strides);
  const auto* pa = static_cast<const float*>(a.raw_data());
  const auto* pb = static_cast<const float*>(b.raw_data());
  auto* po = static_cast<uint8_t*>(out.raw_data());
  const cudaStream_t s = current_stream();
  switch (op) {
    case CompareOp::eq:
      compare_kernel<CompareOp::eq><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, ix, n);
      break;
    case CompareOp::ne:
      compare_kernel<CompareOp::ne><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, ix, n);
      break;
    case CompareOp::lt:
      compare_kernel<CompareOp::lt><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, ix, n);
      break;
    case CompareOp::le:
      compare_kernel<CompareOp::le><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, ix, n);
      break;
    case CompareOp::gt:
      compare_kernel<CompareOp::gt><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, ix, n);
      break;
    case CompareOp::ge:
      compare_kernel<CompareOp::ge><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, ix, n);
      break;
  }
  check_launch("compare");
}

__global__ void where_kernel(const uint8_t* c, const float* a, const float* b, float* out,
                             StridedIndexer<4> ix, int64_t n) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[4];
    ix.offsets(i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  DeviceGuard guard(out.device());
  const int64_t n = out.numel();
  if (n == 0) return;
  const Shape* strides[4] = {&out.strides(), &cond.strides(), &a.strides(), &b.strides()};
  const StridedIndexer<4> ix = make_indexer<4>(out.shape(), strides);
  where_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<const uint8_t*>(cond.raw_data()), static_cast<const float*>(a.raw_data()),
      static_cast<const float*>(b.raw_data()), static_cast<float*>(out.raw_data()), ix, n);
  check_launch("where");
}

// Strides of t with the one along dim zeroed: the start of the row an index picks from.
Shape strides_without(const Tensor& t, int64_t dim) {
  Shape s = t.strides();
  s[static_cast<size_t>(dim)] = 0;
  return s;
}

__global__ void gather_kernel(const float* x, const int64_t* index, float* out,
                              StridedIndexer<3> ix, int64_t n, int64_t bound, int64_t step,
                              DeferredError* err) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t k = index[off[1]];
    if (k < 0 || k >= bound) {
      report_error(err, kIndexOutOfRange, k, bound);
      out[off[0]] = __int_as_float(0x7fc00000);  // NaN
    } else {
      out[off[0]] = x[off[2] + k * step];
    }
  }
}

void gather_cuda(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out, const char*) {
  DeviceGuard guard(out.device());
  const int64_t n = out.numel();
  if (n == 0) return;
  const Shape xs = strides_without(x, dim);
  const Shape* strides[3] = {&out.strides(), &index.strides(), &xs};
  const StridedIndexer<3> ix = make_indexer<3>(out.shape(), strides);
  gather_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<const float*>(x.raw_data()), static_cast<const int64_t*>(index.raw_data()),
      static_cast<float*>(out.raw_data()), ix, n, x.size(dim), x.stride(dim),
      deferred_error_record(out.device().index));
  check_launch("gather");
}

__global__ void scatter_add_kernel(float* self, const int64_t* index, const float* src,
                                   StridedIndexer<3> ix, int64_t n, int64_t bound, int64_t step) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    const int64_t k = index[off[1]];
    if (k >= 0 && k < bound) atomicAdd(self + off[2] + k * step, src[off[0]]);
  }
}

void scatter_add_cuda(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  DeviceGuard guard(self.device());
  const int64_t n = src.numel();
  if (n == 0) return;
  const Shape ss = strides_without(self, dim);
  const Shape* strides[3] = {&src.strides(), &index.strides(), &ss};
  const StridedIndexer<3> ix = make_indexer<3>(src.shape(), strides);
  scatter_add_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<float*>(self.raw_data()), static_cast<const int64_t*>(index.raw_data()),
      static_cast<const float*>(src.raw_data()), ix, n, self.size(dim), self.stride(dim));
  check_launch("scatter_add");
}

// One thread per reduced row: the rows are short in the models this serves (class scores,
// sequence positions), and a fixed scan order gives the CPU's first-among-equals index.
__global__ void max_dim_kernel(const float* x, float* values, int64_t* indices,
                               StridedIndexer<3> ix, int64_t n, int64_t len, int64_t step,
                               bool is_min) {
  DPAR_CUDA_KERNEL_LOOP(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    const float* row = x + off[2];
    float best = row[0];
    int64_t at = 0;
    for (int64_t k = 1; k < len && !isnan(best); ++k) {
      const float v = row[k * step];
      if (isnan(v) || (is_min ? v < best : v > best)) {
        best = v;
        at = k;
      }
    }
    values[off[0]] = best;
    indices[off[1]] = at;
  }
}

void max_dim_cuda(const Tensor& x, int64_t dim, bool is_min, Tensor& values, Tensor& indices) {
  DeviceGuard guard(values.device());
  const int64_t n = values.numel();
  if (n == 0) return;
  const Shape* strides[3] = {&values.strides(), &indices.strides(), &x.strides()};
  const StridedIndexer<3> ix = make_indexer<3>(values.shape(), strides);
  max_dim_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<const float*>(x.raw_data()), static_cast<float*>(values.raw_data()),
      static_cast<int64_t*>(indices.raw_data()), ix, n, x.size(dim), x.stride(dim), is_min);
  check_launch("max_dim");
}

}  // namespace

void register_index_kernels() {
  kernels::compare.set(DeviceType::CUDA, &compare_cuda);
  kernels::where.set(DeviceType::CUDA, &where_cuda);
  kernels::gather.set(DeviceType::CUDA, &gather_cuda);
  kernels::scatter_add.set(DeviceType::CUDA, &scatter_add_cuda);
  kernels::max_dim.set(DeviceType::CUDA, &max_dim_cuda);
}

}  // namespace dpar::cuda
