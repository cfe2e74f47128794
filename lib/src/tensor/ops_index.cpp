// Comparisons, where / masked_fill, gather, index_select, embedding and max/min reductions.
#include "dpar/autograd/function.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/broadcast.h"
#include "tensor/index_kernels.h"

namespace dpar {
namespace {

using kernels::CompareOp;

void check_f32(const Tensor& t, const char* op, const char* which) {
  DPAR_CHECK(t.defined(), op, ": ", which, " is undefined");
  DPAR_CHECK(t.dtype() == DType::f32, op, ": ", which, " must be f32, got ", t.str());
}

void check_index_tensor(const Tensor& index, const Tensor& x, const char* op) {
  DPAR_CHECK(index.defined(), op, ": the index is undefined");
  DPAR_CHECK(index.dtype() == DType::i64, op, ": the index must be i64, got ", index.str());
  DPAR_CHECK(index.device() == x.device(), op, ": the index is on ", index.device(),
             " but the input on ", x.device());
}

Tensor scalar_like(double value, const Tensor& like) {
  return Tensor::full({}, value, DType::f32, like.device());
}

Tensor compare(CompareOp op, const char* name, const Tensor& a_in, const Tensor& b_in) {
  DPAR_PROFILE_SCOPE(name);
  // f16/bf16 CUDA operands (autocast activations) are read as f32 (fp32 list).
  const Tensor a = detail::f32_from_half(a_in), b = detail::f32_from_half(b_in);
  check_f32(a, name, "first operand");
  check_f32(b, name, "second operand");
  DPAR_CHECK(a.device() == b.device(), name, ": operands on different devices (", a.device(),
             " and ", b.device(), ")");
  const Shape shape = detail::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, DType::u8, a.device());
  kernels::compare.get(a.device())(op, detail::expand_to(a, shape), detail::expand_to(b, shape),
                                   out);
  return out;
}

// The gradient of x that gathered/selected rows came from: zeros with g scattered back.
Tensor scatter_back(const Tensor& g, int64_t dim, const Tensor& index, const Shape& x_shape) {
  Tensor gx = Tensor::zeros(x_shape, DType::f32, g.device());
  kernels::scatter_add.get(g.device())(gx, dim, index, g);
  return gx;
}

// index viewed along `dim` of a tensor shaped `shape` (stride 0 in every other dim).
Tensor expand_along(const Tensor& index, int64_t dim, const Shape& shape) {
  Shape strides(shape.size(), 0);
  strides[static_cast<size_t>(dim)] = index.stride(0);
  return Tensor::from_storage(index.storage(), index.storage_offset(), shape, strides, DType::i64);
}

MaxResult reduce_max(const Tensor& x_in, int64_t dim, bool keepdim, bool is_min) {
  const Tensor x = detail::f32_from_half(x_in);
  const char* name = is_min ? "min" : "max";
  DPAR_PROFILE_SCOPE(name);
  check_f32(x, name, "input");
  DPAR_CHECK(x.dim() > 0, name, ": dim ", dim, " of a 0-d tensor; use ", name, "(x) instead");
  const int64_t d = normalize_dim(dim, x.dim(), name);
  DPAR_CHECK(x.size(d) > 0, name, ": dim ", d, " of ", x.shape(), " is empty");
  Shape keep = x.shape();
  keep[static_cast<size_t>(d)] = 1;
  Tensor values = Tensor::empty(keep, DType::f32, x.device());
  Tensor indices = Tensor::empty(keep, DType::i64, x.device());
  kernels::max_dim.get(x.device())(x, d, is_min, values, indices);
  if (autograd::needs_grad({x})) {
    autograd::record(name, {x}, {values},
                     [d, indices, in_shape = x.shape()](const autograd::GradList& g,
                                                        const autograd::NeedsGrad&) {
                       return autograd::GradList{scatter_back(g[0], d, indices, in_shape)};
                     });
  }
  if (!keepdim) {
    values = values.squeeze(d);
    indices = indices.squeeze(d);
  }
  return {values, indices};
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare(CompareOp::eq, "eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(CompareOp::ne, "ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(CompareOp::lt, "lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(CompareOp::le, "le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(CompareOp::gt, "gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(CompareOp::ge, "ge", a, b); }
Tensor eq(const Tensor& a, double b) { return eq(a, scalar_like(b, a)); }
Tensor ne(const Tensor& a, double b) { return ne(a, scalar_like(b, a)); }
Tensor lt(const Tensor& a, double b) { return lt(a, scalar_like(b, a)); }
Tensor le(const Tensor& a, double b) { return le(a, scalar_like(b, a)); }
Tensor gt(const Tensor& a, double b) { return gt(a, scalar_like(b, a)); }
Tensor ge(const Tensor& a, double b) { return ge(a, scalar_like(b, a)); }

Tensor where(const Tensor& cond, const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = detail::f32_from_half(a_in), b = detail::f32_from_half(b_in);
  DPAR_PROFILE_SCOPE("where");
  DPAR_CHECK(cond.defined() && cond.dtype() == DType::u8,
             "where: the condition must be a u8 tensor (what comparisons return), got ",
             cond.defined() ? cond.str() : std::string("undefined"));
  check_f32(a, "where", "first value");
  check_f32(b, "where", "second value");
  DPAR_CHECK(cond.device() == a.device() && a.device() == b.device(),
             "where: operands on different devices (", cond.device(), ", ", a.device(), ", ",
             b.device(), ")");
  const Shape shape = detail::broadcast_shapes(
      detail::broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = Tensor::empty(shape, DType::f32, a.device());
  kernels::where.get(a.device())(detail::expand_to(cond, shape), detail::expand_to(a, shape),
                                 detail::expand_to(b, shape), out);
  if (autograd::needs_grad({a, b})) {
    autograd::record("where", {a, b}, {out},
                     [cond, sa = a.shape(), sb = b.shape()](const autograd::GradList& g,
                                                            const autograd::NeedsGrad& need) {
                       const Tensor zero = scalar_like(0.0, g[0]);
                       autograd::GradList grads(2);
                       if (need[0]) grads[0] = detail::sum_to_shape(where(cond, g[0], zero), sa);
                       if (need[1]) grads[1] = detail::sum_to_shape(where(cond, zero, g[0]), sb);
                       return grads;
                     });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, double b) {
  return where(cond, a, scalar_like(b, a));
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return where(mask, scalar_like(value, x), x);
}

Tensor gather(const Tensor& x_in, int64_t dim, const Tensor& index) {
  const Tensor x = detail::f32_from_half(x_in);
  DPAR_PROFILE_SCOPE("gather");
  check_f32(x, "gather", "input");
  check_index_tensor(index, x, "gather");
  const int64_t d = normalize_dim(dim, x.dim(), "gather");
  DPAR_CHECK(index.dim() == x.dim(), "gather: index ", index.shape(), " and input ", x.shape(),
             " must have the same number of dims");
  for (int64_t k = 0; k < x.dim(); ++k) {
    DPAR_CHECK(k == d || index.size(k) <= x.size(k), "gather: index ", index.shape(),
               " is larger than input ", x.shape(), " in dim ", k);
  }
  Tensor out = Tensor::empty(index.shape(), DType::f32, x.device());
  kernels::gather.get(x.device())(x, d, index, out, "gather");
  if (autograd::needs_grad({x})) {
    autograd::record(
        "gather", {x}, {out},
        [d, index, in_shape = x.shape()](const autograd::GradList& g, const autograd::NeedsGrad&) {
          return autograd::GradList{scatter_back(g[0], d, index, in_shape)};
        });
  }
  return out;
}

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index) {
  const Tensor x = detail::f32_from_half(x_in);
  DPAR_PROFILE_SCOPE("index_select");
  check_f32(x, "index_select", "input");
  check_index_tensor(index, x, "index_select");
  DPAR_CHECK(index.dim() == 1, "index_select: the index must be 1-D, got ", index.shape());
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  Shape shape = x.shape();
  shape[static_cast<size_t>(d)] = index.size(0);
  const Tensor expanded = expand_along(index, d, shape);
  Tensor out = Tensor::empty(shape, DType::f32, x.device());
  kernels::gather.get(x.device())(x, d, expanded, out, "index_select");
  if (autograd::needs_grad({x})) {
    autograd::record("index_select", {x}, {out},
                     [d, expanded, in_shape = x.shape()](const autograd::GradList& g,
                                                         const autograd::NeedsGrad&) {
                       return autograd::GradList{scatter_back(g[0], d, expanded, in_shape)};
                     });
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  DPAR_PROFILE_SCOPE("embedding");
  check_f32(weight, "embedding", "weight");
  DPAR_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got ",
             weight.shape());
  check_index_tensor(indices, weight, "embedding");
  const int64_t rows = weight.size(0), width = weight.size(1);
  int64_t pad = -1;
  if (padding_idx) {
    DPAR_CHECK(*padding_idx >= -rows && *padding_idx < rows, "embedding: padding_idx ",
               *padding_idx, " is outside [", -rows, ", ", rows, ")");
    pad = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
  }
  const Tensor flat = indices.reshape({indices.numel()});
  const Tensor index = expand_along(flat, 0, {flat.size(0), width});
  Tensor out = Tensor::empty({flat.size(0), width}, DType::f32, weight.device());
  kernels::gather.get(weight.device())(weight, 0, index, out, "embedding");
  if (autograd::needs_grad({weight})) {
    autograd::record("embedding", {weight}, {out},
                     [index, pad, shape = weight.shape()](const autograd::GradList& g,
                                                          const autograd::NeedsGrad&) {
                       Tensor gw = scatter_back(g[0], 0, index, shape);
                       // The padding row is a fixed vector: it never learns (PyTorch).
                       if (pad >= 0) gw.select(0, pad).zero_();
                       return autograd::GradList{gw};
                     });
  }
  Shape shape = indices.shape();
  shape.push_back(width);
  return out.view(shape);
}

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce_max(x, dim, keepdim, false);
}
MaxResult min(const Tensor& x, int64_t dim, bool keepdim) {
  return reduce_max(x, dim, keepdim, true);
}

Tensor max(const Tensor& x) {
  DPAR_CHECK(x.defined() && x.numel() > 0, "max: the input is empty");
  return reduce_max(x.reshape({x.numel()}), 0, false, false).values;
}

Tensor min(const Tensor& x) {
  DPAR_CHECK(x.defined() && x.numel() > 0, "min: the input is empty");
  return reduce_max(x.reshape({x.numel()}), 0, false, true).values;
}

}  // namespace dpar
