#include "dpar/torch/tensor.h"

#include <memory>
#include <string>

namespace dpar::torch {

DType dtype_of(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return DType::f32;
    case c10::ScalarType::Half:
      return DType::f16;
    case c10::ScalarType::BFloat16:
      return DType::bf16;
    case c10::ScalarType::Long:
      return DType::i64;
    case c10::ScalarType::Byte:
      return DType::u8;
    default:
      DPAR_FAIL("dpar::torch: a libtorch tensor of dtype ", c10::toString(type),
                " cannot be viewed as a dpar tensor (dpar has float32, float16, bfloat16, int64 "
                "and uint8); convert it with .to() first");
  }
}

c10::ScalarType scalar_type_of(DType type) {
  switch (type) {
    case DType::f32:
      return c10::ScalarType::Float;
    case DType::f16:
      return c10::ScalarType::Half;
    case DType::bf16:
      return c10::ScalarType::BFloat16;
    case DType::i64:
      return c10::ScalarType::Long;
    case DType::u8:
      return c10::ScalarType::Byte;
  }
  DPAR_FAIL("dpar::torch: unknown dpar dtype ", static_cast<int>(type));
}

namespace {

Device dpar_device_of(const at::Tensor& t) {
  if (t.device().is_cpu()) return Device::cpu();
  if (t.device().is_cuda()) return Device::cuda(t.device().index());
  DPAR_FAIL("dpar::torch: a libtorch tensor on ", t.device().str(),
            " cannot be viewed as a dpar tensor (CPU and CUDA only)");
}

}  // namespace

Tensor to_dpar(const at::Tensor& t) {
  DPAR_CHECK(t.defined(), "dpar::torch::to_dpar: the libtorch tensor is undefined");
  DPAR_CHECK(t.layout() == c10::kStrided, "dpar::torch::to_dpar: a ", t.layout(),
             " libtorch tensor cannot be viewed as a dpar tensor (strided tensors only; call "
             ".to_dense() first)");
  DPAR_CHECK(!t.is_quantized(),
             "dpar::torch::to_dpar: a quantized libtorch tensor cannot be "
             "viewed as a dpar tensor; dequantize it first");
  const DType dtype = dtype_of(t.scalar_type());
  const Device device = dpar_device_of(t);
  const c10::Storage& storage = t.storage();
  // The dpar Storage keeps a reference to libtorch's storage: the memory lives while either
  // side uses it.
  auto keep = std::make_shared<c10::Storage>(storage);
  auto shared = std::make_shared<Storage>(storage.data(), storage.nbytes(), device,
                                          [keep](void*) mutable { keep.reset(); });
  return Tensor::from_storage(std::move(shared), t.storage_offset(),
                              Shape(t.sizes().begin(), t.sizes().end()),
                              Shape(t.strides().begin(), t.strides().end()), dtype);
}

at::Tensor to_torch(const Tensor& d) {
  DPAR_CHECK(d.defined(), "dpar::torch::to_torch: the dpar tensor is undefined");
  auto options = at::TensorOptions().dtype(scalar_type_of(d.dtype()));
  if (d.device().is_cuda()) {
    options = options.device(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(d.device().index)));
  }
  std::shared_ptr<Storage> keep = d.storage();
  return at::from_blob(
      d.raw_data(), d.shape(), d.strides(), [keep](void*) mutable { keep.reset(); }, options);
}

}  // namespace dpar::torch
