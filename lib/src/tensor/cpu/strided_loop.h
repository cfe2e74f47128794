#pragma once
// Iteration over N-d strided tensors for CPU kernels. Dimensions that are contiguous with
// each other in every operand are merged first, so most loops run as a few long rows.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "dpar/tensor/tensor.h"

namespace dpar::cpu {

template <size_t K>
struct StridedLayout {
  std::vector<int64_t> sizes;                   // outer..inner, merged
  std::array<std::vector<int64_t>, K> strides;  // per operand, in elements
};

// Merges dims: drops size-1 dims and joins dim i with i+1 when every operand has
// stride[i] == stride[i+1] * size[i+1].
// Dims are visited in the memory order of operand 0 (largest stride first), so a
// channels-last tensor is walked with C innermost.
template <size_t K>
StridedLayout<K> merge_dims(const Shape& shape, const std::array<const Shape*, K>& strides) {
  StridedLayout<K> out;
  std::vector<size_t> order(shape.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = d;
  const Shape& lead = *strides[0];
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return std::abs(lead[a]) > std::abs(lead[b]); });
  for (size_t d : order) {
    if (shape[d] == 1) continue;
    bool mergeable = !out.sizes.empty();
    for (size_t k = 0; k < K && mergeable; ++k) {
      mergeable = out.strides[k].back() == (*strides[k])[d] * shape[d];
    }
    if (mergeable) {
      out.sizes.back() *= shape[d];
      for (size_t k = 0; k < K; ++k) out.strides[k].back() = (*strides[k])[d];
    } else {
      out.sizes.push_back(shape[d]);
      for (size_t k = 0; k < K; ++k) out.strides[k].push_back((*strides[k])[d]);
    }
  }
  if (out.sizes.empty()) {  // a single element
    out.sizes.push_back(1);
    for (size_t k = 0; k < K; ++k) out.strides[k].push_back(1);
  }
  return out;
}

namespace strided_detail {

// Calls row(offsets, n, inner_strides) for rows [first, last) of L, in memory order.
template <size_t K, class RowFn>
void visit_rows(const StridedLayout<K>& L, int64_t first, int64_t last, RowFn& row) {
  const size_t nd = L.sizes.size();
  const int64_t inner = L.sizes[nd - 1];
  std::array<int64_t, K> inner_strides;
  for (size_t k = 0; k < K; ++k) inner_strides[k] = L.strides[k][nd - 1];
  // The outer multi-index of row `first`, and its offsets.
  std::vector<int64_t> index(nd, 0);
  std::array<int64_t, K> offsets{};
  int64_t rest = first;
  for (int64_t d = static_cast<int64_t>(nd) - 2; d >= 0; --d) {
    index[d] = rest % L.sizes[d];
    rest /= L.sizes[d];
    for (size_t k = 0; k < K; ++k) offsets[k] += index[d] * L.strides[k][d];
  }
  for (int64_t r = first; r < last; ++r) {
    row(offsets, inner, inner_strides);
    // advance the outer multi-index (odometer), updating offsets incrementally
    for (int64_t d = static_cast<int64_t>(nd) - 2; d >= 0; --d) {
      if (++index[d] < L.sizes[d]) {
        for (size_t k = 0; k < K; ++k) offsets[k] += L.strides[k][d];
        break;
      }
      for (size_t k = 0; k < K; ++k) offsets[k] -= L.strides[k][d] * (L.sizes[d] - 1);
      index[d] = 0;
    }
  }
}

template <size_t K>
int64_t outer_rows(const StridedLayout<K>& L) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < L.sizes.size(); ++d) rows *= L.sizes[d];
  return rows;
}

inline bool has_zero_size(const Shape& shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s == 0; });
}

}  // namespace strided_detail

// Calls row(offsets, n, inner_strides) for every innermost row; offsets are element offsets
// of the row's first element in each operand.
template <size_t K, class RowFn>
void for_each_row(const Shape& shape, const std::array<const Shape*, K>& strides, RowFn&& row) {
  if (strided_detail::has_zero_size(shape)) return;
  const StridedLayout<K> L = merge_dims<K>(shape, strides);
  strided_detail::visit_rows(L, 0, strided_detail::outer_rows(L), row);
}

// for_each_row with the rows split into one contiguous run per OpenMP thread once the tensor has
// min_parallel elements. For elementwise row functions only: each row is visited once, by one
// thread, so the result has the same bits on any thread count. Broadcasts (the SE block's scale)
// and layout changes (an NCHW batch made channels-last) take this path; run serially, they left
// the second core waiting in every step.
template <size_t K, class RowFn>
void for_each_row_parallel(const Shape& shape, const std::array<const Shape*, K>& strides,
                           int64_t min_parallel, RowFn&& row) {
  if (strided_detail::has_zero_size(shape)) return;
  const StridedLayout<K> L = merge_dims<K>(shape, strides);
  const int64_t rows = strided_detail::outer_rows(L);
  const int64_t elements = rows * L.sizes.back();
  if (rows < 2 || elements < min_parallel || omp_in_parallel()) {
    strided_detail::visit_rows(L, 0, rows, row);
    return;
  }
#pragma omp parallel
  {
    const int64_t team = omp_get_num_threads();
    const int64_t t = omp_get_thread_num();
    strided_detail::visit_rows(L, rows * t / team, rows * (t + 1) / team, row);
  }
}

}  // namespace dpar::cpu
