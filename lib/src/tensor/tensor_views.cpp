// Views: new TensorImpls over the same storage, recorded in autograd so gradients flow back
// to the base tensor's shape.
#include <numeric>
#include <optional>

#include "dpar/autograd/function.h"
#include "dpar/tensor/tensor.h"

namespace dpar {
namespace {

Tensor make_view(const Tensor& base, int64_t offset, Shape shape, Shape strides) {
  return Tensor::from_storage(base.storage(), offset, shape, strides, base.dtype());
}

void record_view(const char* name, const Tensor& in, const Tensor& out,
                 std::function<Tensor(const Tensor&)> back) {
  if (!autograd::needs_grad({in})) return;
  autograd::record(
      name, {in}, {out},
      [back = std::move(back)](const autograd::GradList& g, const autograd::NeedsGrad&) {
        return autograd::GradList{back(g[0])};
      });
}

// Resolves one -1 entry and checks that the element count is preserved.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape shape = requested;
  int64_t known = 1, infer_at = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      DPAR_CHECK(infer_at < 0, op, ": only one dimension can be -1, got ", requested);
      infer_at = static_cast<int64_t>(d);
    } else {
      DPAR_CHECK(shape[d] >= 0, op, ": invalid dimension ", shape[d], " in ", requested);
      known *= shape[d];
    }
  }
  if (infer_at >= 0) {
    DPAR_CHECK(known != 0 && numel % known == 0, op, ": cannot infer -1 in ", requested, " for ",
               numel, " elements");
    shape[infer_at] = numel / known;
  }
  DPAR_CHECK(shape_numel(shape) == numel, op, ": shape ", requested, " is invalid for ", numel,
             " elements");
  return shape;
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), if any
// (the same chunk-matching rule as PyTorch's view).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides,
                                  const Shape& shape) {
  if (shape_numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(shape);
  Shape strides(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(old_shape.size()) - 1; td >= 0; --td) {
    tensor_numel *= old_shape[td];
    if (td == 0 ||
        (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base_stride = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  const Shape shape = infer_shape(requested, numel(), "view");
  auto strides = view_strides(this->shape(), this->strides(), shape);
  DPAR_CHECK(strides.has_value(), "view: shape ", requested,
             " is incompatible with the layout of a ", this->shape(), " tensor with strides ",
             this->strides(), "; use reshape()");
  Tensor out = make_view(*this, storage_offset(), shape, *strides);
  const Shape in_shape = this->shape();
  record_view("view", *this, out, [in_shape](const Tensor& g) { return g.reshape(in_shape); });
  return out;
}

Tensor Tensor::reshape(const Shape& requested) const {
  const Shape shape = infer_shape(requested, numel(), "reshape");
  if (view_strides(this->shape(), this->strides(), shape)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = normalize_dim(start_dim, dim(), "flatten");
  const int64_t e = normalize_dim(end_dim, dim(), "flatten");
  DPAR_CHECK(s <= e, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= this->shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), this->shape().begin() + e + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = normalize_dim(d, dim(), "slice");
  DPAR_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = shape()[d];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor out = make_view(*this, storage_offset() + start * this->strides()[d], shape, strides);
  const Shape in_shape = this->shape();
  const DType dt = dtype();
  const Device dev = device();
  record_view("slice", *this, out, [=](const Tensor& g) {
    Tensor full = Tensor::zeros(in_shape, dt, dev);
    Tensor window = full.slice(d, start, end, step);
    window.copy_(g);
    return full;
  });
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = normalize_dim(d, dim(), "select");
  const int64_t n = shape()[d];
  DPAR_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dimension ", d,
             " of size ", n);
  if (index < 0) index += n;
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor out = make_view(*this, storage_offset() + index * this->strides()[d], shape, strides);
  const Shape in_shape = this->shape();
  const DType dt = dtype();
  const Device dev = device();
  record_view("select", *this, out, [=](const Tensor& g) {
    Tensor full = Tensor::zeros(in_shape, dt, dev);
    Tensor row = full.select(d, index);
    row.copy_(g);
    return full;
  });
  return out;
}

Tensor Tensor::permute(const Shape& dims) const {
  DPAR_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: got ", dims.size(),
             " dimensions for a ", dim(), "-D tensor");
  Shape shape(dims.size()), strides(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], dim(), "permute");
    DPAR_CHECK(!seen[d], "permute: dimension ", d, " repeated in ", dims);
    seen[d] = true;
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
    inverse[d] = static_cast<int64_t>(i);
  }
  Tensor out = make_view(*this, storage_offset(), shape, strides);
  record_view("permute", *this, out, [inverse](const Tensor& g) { return g.permute(inverse); });
  return out;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  Shape dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_dim(a, dim(), "transpose")], dims[normalize_dim(b, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  shape.insert(shape.begin() + d, 1);
  return reshape(shape);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape shape = this->shape();
  shape.erase(shape.begin() + d);
  return reshape(shape);
}

}  // namespace dpar
