#pragma once
// Mixed precision, as torch.autocast(device_type="cuda", dtype=...):
//
//   amp::GradScaler scaler;                      // fp16 only; bf16 keeps f32's range
//   {
//     amp::Autocast autocast(DType::f16);        // or DType::bf16
//     loss = cross_entropy(model->forward(x), y);
//   }
//   scaler.scale(loss).backward();
//
// Inside the scope, conv2d, linear and matmul on CUDA tensors compute in the given dtype on the
// tensor cores (cuDNN/cuBLAS with f32 accumulation): their f32 inputs and weights are cast on
// the way in, and their outputs come back as f32. Every other op (BatchNorm statistics,
// activations, softmax, the loss) and the parameters (the master weights) stay f32. The
// backward of an op runs in the dtype its forward used, wherever backward() is called. CPU
// tensors are unaffected. The setting is per thread; scopes nest.
#include "dpar/core/dtype.h"

namespace dpar::amp {

class Autocast {
 public:
  // dtype: f16 or bf16 (f32 turns autocast off inside the scope); enabled = false: no change.
  explicit Autocast(DType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DType previous_;
};

// The compute dtype autocast gives eligible CUDA ops on this thread; f32 when off.
DType autocast_dtype();

}  // namespace dpar::amp
