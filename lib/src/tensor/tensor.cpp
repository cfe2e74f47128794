#include "dpar/tensor/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "dpar/autograd/engine.h"
#include "dpar/autograd/function.h"
#include "dpar/autograd/grad_mode.h"
#include "dpar/autograd/node.h"
#include "tensor/core_kernels.h"

namespace dpar {

TensorImpl::~TensorImpl() = default;

// ---- shape helpers -------------------------------------------------------------------------
int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

Shape channels_last_strides(const Shape& shape) {
  DPAR_CHECK(shape.size() == 4, "channels-last layout needs a 4-D shape, got ", shape);
  const int64_t C = std::max<int64_t>(shape[1], 1), H = std::max<int64_t>(shape[2], 1),
                W = std::max<int64_t>(shape[3], 1);
  return {H * W * C, 1, W * C, C};
}

std::string shape_str(const Shape& shape) { return detail::str_cat(shape); }

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  DPAR_CHECK(dim >= lo && dim <= hi, op, ": dimension ", dim, " out of range for a ", ndim,
             "-D tensor");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

namespace {

void check_shape(const Shape& shape, const char* what) {
  for (int64_t s : shape) DPAR_CHECK(s >= 0, what, ": negative dimension in shape ", shape);
}

std::shared_ptr<TensorImpl> make_impl(std::shared_ptr<Storage> storage, int64_t offset, Shape shape,
                                      Shape strides, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return impl;
}

// Bytes spanned by a strided tensor (for storage sizing of empty_strided).
int64_t span_elements(const Shape& shape, const Shape& strides) {
  if (shape_numel(shape) == 0) return 0;
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return last + 1;
}

}  // namespace

// ---- factories -----------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  check_shape(shape, "Tensor::empty");
  Shape strides = format == MemoryFormat::ChannelsLast ? channels_last_strides(shape)
                                                       : contiguous_strides(shape);
  return empty_strided(shape, strides, dtype, device);
}

Tensor Tensor::empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  check_shape(shape, "Tensor::empty_strided");
  DPAR_CHECK(shape.size() == strides.size(), "Tensor::empty_strided: shape ", shape,
             " and strides ", strides, " differ in rank");
  const size_t nbytes = static_cast<size_t>(span_elements(shape, strides)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(make_impl(std::move(storage), 0, shape, strides, dtype));
}

Tensor Tensor::empty_like(const Tensor& like) {
  if (like.is_dense())
    return empty_strided(like.shape(), like.strides(), like.dtype(), like.device());
  return empty(like.shape(), like.dtype(), like.device());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor Tensor::zeros_like(const Tensor& like) {
  Tensor t = empty_like(like);
  t.fill_(0.0);
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  check_shape(shape, "Tensor::empty_pinned");
  // Pinned memory belongs to the CUDA backend (cudaHostAlloc); the first device must be usable.
  const Device gpu = Device::cuda(0);
  DPAR_CHECK(kernels::alloc_pinned.available(gpu),
             "pin_memory: pinned host memory needs CUDA:", detail::missing_backend_note(gpu));
  DPAR_CHECK(cuda_device_count() > 0,
             "pin_memory: pinned host memory needs a CUDA device: ", cuda_unavailable_reason());
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto storage = kernels::alloc_pinned.get(gpu)(nbytes);
  return Tensor(make_impl(std::move(storage), 0, shape, contiguous_strides(shape), dtype));
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  DPAR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "Tensor::from_vector: ", values.size(), " values do not fill shape ", shape);
  Tensor t = empty(shape, DType::f32);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape) {
  DPAR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "Tensor::from_vector: ", values.size(), " values do not fill shape ", shape);
  Tensor t = empty(shape, DType::i64);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype,
                         std::function<void(void*)> deleter) {
  check_shape(shape, "Tensor::from_blob");
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(data, nbytes, Device::cpu(), std::move(deleter));
  return Tensor(make_impl(std::move(storage), 0, shape, contiguous_strides(shape), dtype));
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
                            const Shape& strides, DType dtype) {
  DPAR_CHECK(storage != nullptr, "Tensor::from_storage: null storage");
  const int64_t end =
      (offset + span_elements(shape, strides)) * static_cast<int64_t>(dtype_size(dtype));
  DPAR_CHECK(end <= static_cast<int64_t>(storage->nbytes()), "Tensor::from_storage: view of shape ",
             shape, " at offset ", offset, " exceeds storage of ", storage->nbytes(), " bytes");
  return Tensor(make_impl(std::move(storage), offset, shape, strides, dtype));
}

// ---- metadata ------------------------------------------------------------------------------
#define DPAR_REQUIRE_DEFINED(fn) DPAR_CHECK(impl_ != nullptr, "Tensor::" fn ": tensor is undefined")

const Shape& Tensor::shape() const {
  DPAR_REQUIRE_DEFINED("shape");
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  DPAR_REQUIRE_DEFINED("strides");
  return impl_->strides;
}
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "Tensor::size")]; }
int64_t Tensor::stride(int64_t d) const {
  return strides()[normalize_dim(d, dim(), "Tensor::stride")];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const {
  DPAR_REQUIRE_DEFINED("dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  DPAR_REQUIRE_DEFINED("device");
  return impl_->storage->device();
}
int64_t Tensor::storage_offset() const {
  DPAR_REQUIRE_DEFINED("storage_offset");
  return impl_->offset;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  DPAR_REQUIRE_DEFINED("storage");
  return impl_->storage;
}
void* Tensor::raw_data() const {
  DPAR_REQUIRE_DEFINED("raw_data");
  // Memory an asynchronous collective is still writing is handed out only once it is written.
  if (impl_->storage->has_pending_write()) impl_->storage->finish_pending_write();
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * static_cast<int64_t>(dtype_size(impl_->dtype));
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return detail::str_cat("Tensor(", dtype(), ", ", device().str(), ", ", shape(), ")");
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  const Shape& sh = shape();
  if (format == MemoryFormat::ChannelsLast && sh.size() != 4) return false;
  const Shape expect =
      format == MemoryFormat::ChannelsLast ? channels_last_strides(sh) : contiguous_strides(sh);
  for (size_t d = 0; d < sh.size(); ++d) {
    if (sh[d] != 1 && strides()[d] != expect[d]) return false;
  }
  return true;
}

bool Tensor::is_dense() const {
  const Shape& sh = shape();
  if (numel() == 0) return true;
  std::vector<size_t> dims;
  for (size_t d = 0; d < sh.size(); ++d) {
    if (sh[d] != 1) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(),
            [&](size_t a, size_t b) { return strides()[a] > strides()[b]; });
  int64_t expected = 1;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    if (strides()[*it] != expected) return false;
    expected *= sh[*it];
  }
  return true;
}

// ---- conversions ---------------------------------------------------------------------------
namespace {
// Records an identity-like op whose backward converts the gradient back with `back`.
void record_conversion(const char* name, const Tensor& in, const Tensor& out,
                       std::function<Tensor(const Tensor&)> back) {
  if (!autograd::needs_grad({in})) return;
  autograd::record(
      name, {in}, {out},
      [back = std::move(back)](const autograd::GradList& g, const autograd::NeedsGrad&) {
        return autograd::GradList{back(g[0])};
      });
}
}  // namespace

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (is_contiguous(format)) return *this;
  Tensor out = empty(shape(), dtype(), device(), format);
  out.copy_(*this);
  record_conversion("contiguous", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty_like(*this);
  out.copy_(*this);
  record_conversion("clone", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  Tensor out = empty_strided(shape(), is_dense() ? strides() : contiguous_strides(shape()), target,
                             device());
  out.copy_(*this);
  const DType source = dtype();
  if (is_floating(source) && is_floating(target)) {
    record_conversion("to_dtype", *this, out, [source](const Tensor& g) { return g.to(source); });
  }
  return out;
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), target);
  out.copy_(src);
  const Device source = device();
  record_conversion("to_device", *this, out, [source](const Tensor& g) { return g.to(source); });
  return out;
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  const bool async = non_blocking && target.is_cuda() && is_pinned() && is_contiguous() &&
                     !requires_grad() && kernels::to_device_async.available(target);
  if (!async) return to(target);
  return kernels::to_device_async.get(target)(*this, target);
}

bool Tensor::is_pinned() const { return defined() && storage() && storage()->pinned(); }

Tensor Tensor::pin_memory() const {
  DPAR_CHECK(device().is_cpu(), "pin_memory: expected a CPU tensor, got one on ", device().str());
  if (is_pinned()) return *this;
  Tensor out = empty_pinned(shape(), dtype());
  NoGradGuard no_grad;
  out.copy_(*this);
  return out;
}

// ---- in-place --------------------------------------------------------------------------------
Tensor& Tensor::copy_(const Tensor& src) {
  DPAR_CHECK(src.defined(), "Tensor::copy_: source is undefined");
  DPAR_CHECK(shape() == src.shape(), "Tensor::copy_: shape ", src.shape(),
             " does not match destination ", shape());
  autograd::drop_recompute(*this);
  if (device() == src.device()) {
    kernels::copy.get(device())(src, *this);
    return *this;
  }
  // Across devices: the non-CPU backend's transfer kernel moves dense data; layouts and dtypes
  // are matched on the source side first.
  const Device accel = device().is_cpu() ? src.device() : device();
  Tensor staged = src;
  if (src.dtype() != dtype() || src.strides() != strides() || !src.is_dense()) {
    NoGradGuard no_grad;
    staged = src.to(dtype());
    Tensor tmp = empty_strided(shape(), is_dense() ? strides() : contiguous_strides(shape()),
                               dtype(), src.device());
    tmp.copy_(staged);
    staged = tmp;
  }
  if (is_dense() && staged.strides() == strides()) {
    kernels::copy_across_devices.get(accel)(staged, *this);
  } else {
    Tensor landing = empty_strided(shape(), staged.strides(), dtype(), device());
    kernels::copy_across_devices.get(accel)(staged, landing);
    kernels::copy.get(device())(landing, *this);
  }
  return *this;
}

Tensor& Tensor::fill_(double value) {
  autograd::drop_recompute(*this);
  kernels::fill.get(device())(*this, value);
  return *this;
}

// ---- reading values --------------------------------------------------------------------------
double Tensor::item() const {
  DPAR_CHECK(numel() == 1, "Tensor::item: tensor of shape ", shape(), " has ", numel(),
             " elements, expected 1");
  Tensor host = to(Device::cpu());
  if (dtype() == DType::i64) return static_cast<double>(*host.to(DType::i64).data<int64_t>());
  return static_cast<double>(*host.detach().to(DType::f32).data<float>());
}

std::vector<float> Tensor::to_float_vector() const {
  NoGradGuard no_grad;
  Tensor host = to(Device::cpu()).to(DType::f32).contiguous();
  const float* p = host.data<float>();
  return std::vector<float>(p, p + host.numel());
}

std::vector<int64_t> Tensor::to_int_vector() const {
  NoGradGuard no_grad;
  Tensor host = to(Device::cpu()).to(DType::i64).contiguous();
  const int64_t* p = host.data<int64_t>();
  return std::vector<int64_t>(p, p + host.numel());
}

// ---- autograd --------------------------------------------------------------------------------
bool Tensor::requires_grad() const {
  return impl_ && impl_->autograd && impl_->autograd->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  DPAR_REQUIRE_DEFINED("set_requires_grad");
  DPAR_CHECK(is_leaf(),
             "Tensor::set_requires_grad: only leaf tensors can change requires_grad; "
             "use detach() to make a leaf");
  DPAR_CHECK(!requires_grad || is_floating(dtype()), "Tensor::set_requires_grad: ", dtype(),
             " tensors cannot require gradients");
  if (!impl_->autograd) impl_->autograd = std::make_unique<autograd::AutogradMeta>();
  impl_->autograd->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_ || !impl_->autograd || !impl_->autograd->grad_fn; }

Tensor Tensor::grad() const {
  if (!impl_ || !impl_->autograd || !impl_->autograd->grad) return Tensor();
  return Tensor(impl_->autograd->grad);
}

void Tensor::set_grad(const Tensor& grad) {
  DPAR_REQUIRE_DEFINED("set_grad");
  if (grad.defined()) {
    DPAR_CHECK(grad.shape() == shape(), "Tensor::set_grad: gradient shape ", grad.shape(),
               " does not match tensor shape ", shape());
  }
  if (!impl_->autograd) impl_->autograd = std::make_unique<autograd::AutogradMeta>();
  impl_->autograd->grad = grad.impl_ptr();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  if (!impl_ || !impl_->autograd) return none;
  return impl_->autograd->grad_fn;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::detach() const {
  DPAR_REQUIRE_DEFINED("detach");
  return Tensor(
      make_impl(impl_->storage, impl_->offset, impl_->shape, impl_->strides, impl_->dtype));
}

int Tensor::register_grad_ready_hook(GradReadyHook hook) {
  DPAR_CHECK(requires_grad() && is_leaf(),
             "Tensor::register_grad_ready_hook: only leaf tensors that require grad have "
             "gradient-ready hooks");
  auto& meta = *impl_->autograd;
  const int handle = meta.next_hook_handle++;
  meta.ready_hooks.emplace_back(handle, std::move(hook));
  return handle;
}

void Tensor::remove_grad_ready_hook(int handle) {
  if (!impl_ || !impl_->autograd) return;
  auto& hooks = impl_->autograd->ready_hooks;
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [handle](const auto& h) { return h.first == handle; }),
              hooks.end());
}

}  // namespace dpar
