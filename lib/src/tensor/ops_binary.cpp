// add / sub / mul / div with broadcasting, scalar forms, and the in-place updates.
#include "dpar/autograd/function.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/core/profiler.h"
#include "dpar/tensor/ops.h"
#include "tensor/autocast_policy.h"
#include "tensor/broadcast.h"
#include "tensor/elementwise_kernels.h"

namespace dpar {
namespace detail {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DPAR_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
               " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor expand_to(const Tensor& t, const Shape& shape) {
  const size_t lead = shape.size() - t.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < t.shape().size(); ++i) {
    strides[lead + i] = t.shape()[i] == 1 && shape[lead + i] != 1 ? 0 : t.strides()[i];
  }
  return Tensor::from_storage(t.storage(), t.storage_offset(), shape, strides, t.dtype());
}

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  // Reduce into the keepdim form of `shape` aligned to g's rank, then drop leading dims.
  const size_t lead = g.shape().size() - shape.size();
  Shape keep(g.shape().size(), 1);
  for (size_t i = 0; i < shape.size(); ++i) keep[lead + i] = shape[i];
  Tensor out = Tensor::empty(keep, g.dtype(), g.device());
  kernels::sum_to.get(g.device())(g, out);
  return out.view(shape);
}

}  // namespace detail

namespace {

// sum_to_shape(mul(g, other), shape) without the product where the backend fuses the two: the
// gradient of mul's broadcast operand (the SE block's per-channel scale).
Tensor mul_sum_to_shape(const Tensor& g, const Tensor& other, const Shape& shape) {
  if (shape != g.shape() && shape.size() == g.shape().size() && other.shape() == g.shape() &&
      g.dtype() == DType::f32 && other.dtype() == DType::f32 &&
      kernels::mul_sum_to.available(g.device())) {
    Tensor out = Tensor::empty(shape, DType::f32, g.device());
    kernels::mul_sum_to.get(g.device())(g, other, out);
    return out;
  }
  return detail::sum_to_shape(mul(g, other), shape);
}

void check_float(const Tensor& t, const char* op, const char* which) {
  DPAR_CHECK(t.defined(), op, ": ", which, " is undefined");
  DPAR_CHECK(
      detail::elementwise_dtype_ok(t), op, ": ", which, " has dtype ", t.dtype(), " on ",
      t.device(),
      "; arithmetic supports f32, f16/bf16 on CUDA and bf16 on the CPU (convert with .to())");
}

// An f16/bf16 operand meeting an f32 one (an autocast activation and an f32 tensor): both go
// to f32, as PyTorch's type promotion has it.
bool mixed_floats(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() != b.dtype() && detail::elementwise_dtype_ok(a) &&
         detail::elementwise_dtype_ok(b);
}

Tensor binary(kernels::BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  DPAR_PROFILE_SCOPE(name);
  check_float(a, name, "first operand");
  check_float(b, name, "second operand");
  DPAR_CHECK(a.device() == b.device(), name, ": operands on different devices (", a.device(),
             " and ", b.device(), ")");
  const Shape shape = detail::broadcast_shapes(a.shape(), b.shape(), name);
  // Keep the layout of an operand that already has the output shape (e.g. channels-last).
  Tensor out;
  if (a.shape() == shape && a.is_dense()) {
    out = Tensor::empty_like(a);
  } else if (b.shape() == shape && b.is_dense()) {
    out = Tensor::empty_like(b);
  } else {
    out = Tensor::empty(shape, a.dtype(), a.device());
  }
  kernels::binary.get(a.device())(op, detail::expand_to(a, shape), detail::expand_to(b, shape),
                                  out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (mixed_floats(a, b)) return add(detail::f32_from_half(a), detail::f32_from_half(b));
  Tensor out = binary(kernels::BinaryOp::add, "add", a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record("add", {a, b}, {out},
                     [sa = a.shape(), sb = b.shape()](const autograd::GradList& g,
                                                      const autograd::NeedsGrad& need) {
                       return autograd::GradList{
                           need[0] ? detail::sum_to_shape(g[0], sa) : Tensor(),
                           need[1] ? detail::sum_to_shape(g[0], sb) : Tensor()};
                     });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (mixed_floats(a, b)) return sub(detail::f32_from_half(a), detail::f32_from_half(b));
  Tensor out = binary(kernels::BinaryOp::sub, "sub", a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record("sub", {a, b}, {out},
                     [sa = a.shape(), sb = b.shape()](const autograd::GradList& g,
                                                      const autograd::NeedsGrad& need) {
                       return autograd::GradList{
                           need[0] ? detail::sum_to_shape(g[0], sa) : Tensor(),
                           need[1] ? detail::sum_to_shape(neg(g[0]), sb) : Tensor()};
                     });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (mixed_floats(a, b)) return mul(detail::f32_from_half(a), detail::f32_from_half(b));
  Tensor out = binary(kernels::BinaryOp::mul, "mul", a, b);
  if (autograd::needs_grad({a, b})) {
    // The operands themselves are kept, even one that could be made again (an activation): the
    // product gets a recipe from them (the SE block's scaled activation, which the projection
    // reads next), so the activation's own recipe would run twice in backward, once for that
    // and once here. Keeping it costs its bytes (MobileNetV3-small's SE activations: 18 MB at
    // batch 16) and saves two passes over it.
    const bool remakeable = static_cast<bool>(autograd::recompute_of(a)) ||
                            static_cast<bool>(autograd::recompute_of(b));
    autograd::record("mul", {a, b}, {out},
                     [ad = a.detach(), bd = b.detach()](const autograd::GradList& g,
                                                        const autograd::NeedsGrad& need) {
                       Tensor ga, gb;
                       if (need[0]) ga = mul_sum_to_shape(g[0], bd, ad.shape());
                       if (need[1]) gb = mul_sum_to_shape(g[0], ad, bd.shape());
                       return autograd::GradList{ga, gb};
                     });
    if (remakeable) {
      autograd::set_recompute(out, [ad = a.detach(), bd = b.detach()] {
        return binary(kernels::BinaryOp::mul, "mul", ad, bd);
      });
    }
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (mixed_floats(a, b)) return div(detail::f32_from_half(a), detail::f32_from_half(b));
  Tensor out = binary(kernels::BinaryOp::div, "div", a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record("div", {a, b}, {out},
                     [ad = a.detach(), bd = b.detach()](const autograd::GradList& g,
                                                        const autograd::NeedsGrad& need) {
                       Tensor ga, gb;
                       if (need[0]) ga = detail::sum_to_shape(div(g[0], bd), ad.shape());
                       if (need[1])
                         gb =
                             detail::sum_to_shape(neg(div(mul(g[0], ad), mul(bd, bd))), bd.shape());
                       return autograd::GradList{ga, gb};
                     });
  }
  return out;
}

namespace {
Tensor affine(const Tensor& a, double alpha, double beta, const char* name) {
  DPAR_PROFILE_SCOPE(name);
  check_float(a, name, "input");
  Tensor out = Tensor::empty_like(a);
  kernels::affine.get(a.device())(a, alpha, beta, out);
  if (autograd::needs_grad({a})) {
    autograd::record(name, {a}, {out},
                     [alpha](const autograd::GradList& g, const autograd::NeedsGrad&) {
                       return autograd::GradList{alpha == 1.0 ? g[0] : mul(g[0], alpha)};
                     });
  }
  return out;
}
}  // namespace

Tensor add(const Tensor& a, double b) { return affine(a, 1.0, b, "add_scalar"); }
Tensor mul(const Tensor& a, double b) { return affine(a, b, 0.0, "mul_scalar"); }
Tensor neg(const Tensor& x) { return affine(x, -1.0, 0.0, "neg"); }

Tensor& add_(Tensor& self, const Tensor& other, double alpha) {
  check_float(self, "add_", "self");
  check_float(other, "add_", "other");
  DPAR_CHECK(self.shape() == other.shape(), "add_: shape ", other.shape(), " does not match ",
             self.shape());
  autograd::drop_recompute(self);
  kernels::add_inplace.get(self.device())(self, other, alpha);
  return self;
}

Tensor& mul_(Tensor& self, double value) {
  check_float(self, "mul_", "self");
  autograd::drop_recompute(self);
  kernels::affine.get(self.device())(self, value, 0.0, self);
  return self;
}

}  // namespace dpar
