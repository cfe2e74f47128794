#pragma once
// Tensor: a refcounted handle to (storage, offset, shape, strides, dtype) plus autograd
// metadata. Copying a Tensor copies the handle; views share storage. Shapes are logical
// (NCHW for images); the strides say how memory is laid out, so a channels-last (NHWC)
// activation is still shape [N,C,H,W] with strides [HWC,1,WC,C].
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpar/core/device.h"
#include "dpar/core/dtype.h"
#include "dpar/core/error.h"
#include "dpar/tensor/storage.h"

namespace dpar {

using Shape = std::vector<int64_t>;

enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };

namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

struct TensorImpl;
class Tensor;

// Called once per backward pass when a parameter's gradient is final (see autograd/engine.h).
using GradReadyHook = std::function<void(Tensor& param)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories -------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryFormat format = MemoryFormat::Contiguous);
  static Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype = DType::f32,
                              Device device = Device::cpu());
  // Same shape, dtype, device and (for dense tensors) the same memory layout as like.
  static Tensor empty_like(const Tensor& like);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor zeros_like(const Tensor& like);
  // A contiguous CPU tensor in page-locked (pinned) memory, which a GPU copies from
  // asynchronously (see to(device, non_blocking)). Needs a usable CUDA device; throws
  // dpar::Error saying why otherwise. Pinned blocks are cached and reused.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape);
  // Wraps existing CPU memory without copying; deleter (may be empty) runs when unused.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          std::function<void(void*)> deleter = {});
  // A view of an existing storage (used by DataParallel to make gradients views of buckets).
  static Tensor from_storage(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
                             const Shape& strides, DType dtype);

  // ---- metadata --------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  int64_t storage_offset() const;  // in elements
  const std::shared_ptr<Storage>& storage() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  void* raw_data() const;  // address of the first element
  template <class T>
  T* data() const {
    DPAR_CHECK(dtype() == DTypeOf<T>::value, "Tensor::data: tensor is ", dtype(), ", asked for ",
               dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(raw_data());
  }

  // Layout predicates. Dense: the elements fill [first, first+numel) without gaps or overlap
  // in some dimension order (so elementwise kernels can run over flat memory).
  bool is_contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  bool is_dense() const;

  // ---- conversions (differentiable where it makes sense) -----------------------------------
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  Tensor clone() const;  // same layout if dense, else contiguous
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  // With non_blocking, a pinned CPU tensor goes to a CUDA device on that device's copy stream
  // without waiting for the host or for the kernels already queued: the current stream waits
  // for the copy, so later kernels see the data. Otherwise (or for a tensor that requires
  // grad) the same as to(device).
  Tensor to(Device device, bool non_blocking) const;
  Tensor pin_memory() const;  // a pinned copy of a CPU tensor (itself when already pinned)
  bool is_pinned() const;

  // ---- views (differentiable; share storage) ---------------------------------------------
  Tensor view(const Shape& shape) const;     // throws if the strides do not allow a view
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const Shape& dims) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  // ---- in-place, not recorded by autograd (optimizers and init run these under no_grad) ----
  Tensor& copy_(const Tensor& src);  // any layout / dtype; shapes must match
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // ---- reading values ----------------------------------------------------------------------
  double item() const;                         // one-element tensor of any dtype
  std::vector<float> to_float_vector() const;  // any layout/dtype, logical order
  std::vector<int64_t> to_int_vector() const;

  // ---- autograd ----------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad = true);  // leaves only
  bool is_leaf() const;
  Tensor grad() const;  // undefined when no gradient was accumulated yet
  void set_grad(const Tensor& grad);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Runs backward from this tensor. gradient defaults to 1 for a one-element tensor.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  Tensor detach() const;  // shares storage, no autograd history
  // Fires after this leaf's gradient is final in a backward pass; returns a handle.
  int register_grad_ready_hook(GradReadyHook hook);
  void remove_grad_ready_hook(int handle);

  // ---- identity ----------------------------------------------------------------------------
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  std::string str() const;  // "Tensor(f32, cpu, [2,3])"

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;
  Shape shape;
  Shape strides;
  DType dtype = DType::f32;
  std::unique_ptr<autograd::AutogradMeta> autograd;  // null for tensors outside autograd
  ~TensorImpl();
};

// Helpers on shapes used across ops.
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
Shape channels_last_strides(const Shape& shape);  // 4-D only
std::string shape_str(const Shape& shape);
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace dpar
