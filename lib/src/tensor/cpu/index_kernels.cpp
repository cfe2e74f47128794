// CPU kernels for where, comparisons, gather / scatter_add and max/min over a dim.
#include "tensor/index_kernels.h"

#include <cmath>

#include "tensor/cpu/strided_loop.h"

namespace dpar::cpu {
namespace {

using kernels::CompareOp;

template <CompareOp Op>
inline uint8_t compare_one(float x, float y) {
  if constexpr (Op == CompareOp::eq) return x == y;
  if constexpr (Op == CompareOp::ne) return x != y;
  if constexpr (Op == CompareOp::lt) return x < y;
  if constexpr (Op == CompareOp::le) return x <= y;
  if constexpr (Op == CompareOp::gt) return x > y;
  if constexpr (Op == CompareOp::ge) return x >= y;
}

template <CompareOp Op>
void compare_typed(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = static_cast<const float*>(a.raw_data());
  const float* pb = static_cast<const float*>(b.raw_data());
  uint8_t* po = static_cast<uint8_t*>(out.raw_data());
  for_each_row<3>(
      out.shape(), {&out.strides(), &a.strides(), &b.strides()},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        for (int64_t i = 0; i < n; ++i) {
          po[off[0] + i * st[0]] = compare_one<Op>(pa[off[1] + i * st[1]], pb[off[2] + i * st[2]]);
        }
      });
}

void compare_cpu(CompareOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  switch (op) {
    case CompareOp::eq:
      return compare_typed<CompareOp::eq>(a, b, out);
    case CompareOp::ne:
      return compare_typed<CompareOp::ne>(a, b, out);
    case CompareOp::lt:
      return compare_typed<CompareOp::lt>(a, b, out);
    case CompareOp::le:
      return compare_typed<CompareOp::le>(a, b, out);
    case CompareOp::gt:
      return compare_typed<CompareOp::gt>(a, b, out);
    case CompareOp::ge:
      return compare_typed<CompareOp::ge>(a, b, out);
  }
}

void where_cpu(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  const uint8_t* pc = static_cast<const uint8_t*>(cond.raw_data());
  const float* pa = static_cast<const float*>(a.raw_data());
  const float* pb = static_cast<const float*>(b.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  for_each_row<4>(
      out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()},
      [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& st) {
        for (int64_t i = 0; i < n; ++i) {
          po[off[0] + i * st[0]] =
              pc[off[1] + i * st[1]] ? pa[off[2] + i * st[2]] : pb[off[3] + i * st[3]];
        }
      });
}

// x's strides with the one along dim zeroed: the offset of the row an index picks from.
Shape strides_without(const Tensor& t, int64_t dim) {
  Shape s = t.strides();
  s[static_cast<size_t>(dim)] = 0;
  return s;
}

void gather_cpu(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out, const char* op) {
  const float* px = static_cast<const float*>(x.raw_data());
  const int64_t* pi = static_cast<const int64_t*>(index.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  const Shape xs = strides_without(x, dim);
  const int64_t bound = x.size(dim), step = x.stride(dim);
  for_each_row<3>(
      out.shape(), {&out.strides(), &index.strides(), &xs},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = pi[off[1] + i * st[1]];
          DPAR_CHECK(k >= 0 && k < bound, op, ": index ", k, " is outside [0, ", bound, ")");
          po[off[0] + i * st[0]] = px[off[2] + i * st[2] + k * step];
        }
      });
}

void scatter_add_cpu(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  float* ps = static_cast<float*>(self.raw_data());
  const int64_t* pi = static_cast<const int64_t*>(index.raw_data());
  const float* pv = static_cast<const float*>(src.raw_data());
  const Shape ss = strides_without(self, dim);
  const int64_t step = self.stride(dim);
  // Operand 0 leads the loop order: src in its own memory order, one thread, so repeated
  // indices add up in the same order every run.
  for_each_row<3>(
      src.shape(), {&src.strides(), &index.strides(), &ss},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        for (int64_t i = 0; i < n; ++i) {
          ps[off[2] + i * st[2] + pi[off[1] + i * st[1]] * step] += pv[off[0] + i * st[0]];
        }
      });
}

void max_dim_cpu(const Tensor& x, int64_t dim, bool is_min, Tensor& values, Tensor& indices) {
  const float* px = static_cast<const float*>(x.raw_data());
  float* pv = static_cast<float*>(values.raw_data());
  int64_t* pi = static_cast<int64_t*>(indices.raw_data());
  const int64_t len = x.size(dim), step = x.stride(dim);
  // One reduction per element of values (which has size 1 along dim).
  const Shape xs = x.strides();
  for_each_row<3>(
      values.shape(), {&values.strides(), &indices.strides(), &xs},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        for (int64_t i = 0; i < n; ++i) {
          const float* row = px + off[2] + i * st[2];
          float best = row[0];
          int64_t at = 0;
          for (int64_t k = 1; k < len && !std::isnan(best); ++k) {
            const float v = row[k * step];
            if (std::isnan(v) || (is_min ? v < best : v > best)) {
              best = v;
              at = k;
            }
          }
          pv[off[0] + i * st[0]] = best;
          pi[off[1] + i * st[1]] = at;
        }
      });
}

}  // namespace

void register_index_kernels() {
  kernels::compare.set(DeviceType::CPU, &compare_cpu);
  kernels::where.set(DeviceType::CPU, &where_cpu);
  kernels::gather.set(DeviceType::CPU, &gather_cpu);
  kernels::scatter_add.set(DeviceType::CPU, &scatter_add_cpu);
  kernels::max_dim.set(DeviceType::CPU, &max_dim_cpu);
}

}  // namespace dpar::cpu
