#pragma once
// Mixed precision, as torch.autocast(device_type=..., dtype=...):
//
//   amp::GradScaler scaler;                      // fp16 only; bf16 keeps f32's range
//   {
//     amp::Autocast autocast(DType::f16);        // or DType::bf16
//     loss = cross_entropy(model->forward(x), y);
//   }
//   scaler.scale(loss).backward();
//
// Inside the scope, conv2d, linear and matmul compute in the given dtype with f32 accumulation
// (cuDNN/cuBLAS on the tensor cores; oneDNN's bf16 kernels on the CPU, bf16 only): their
// operands are cast on the way in, and their results stay in that dtype, as torch.autocast's
// do. The ops between them (adds and products, activations, dropout, BatchNorm, global
// pooling) then read and write f16/bf16, computing in f32 with one rounding at the store;
// BatchNorm's statistics and parameters stay f32. Ops on torch.autocast's fp32 list (softmax,
// log_softmax, the losses, layer and group norm, reductions, attention, window pooling,
// indexing) take half-precision inputs as f32, and an f32 tensor meeting a half one makes both
// f32. The parameters (the master weights) and their gradients stay f32; every gradient comes
// back in its input's dtype. The backward of an op runs in the dtype its forward used,
// wherever backward() is called. The same policy holds on both devices, except that the CPU
// has no f16: Autocast(f16) leaves CPU ops in f32 (as torch.autocast(device_type="cpu") did
// before PyTorch 2.4), and Autocast(bf16) needs AVX-512 on the CPU (cpu_bf16_support()).
// The setting is per thread; scopes nest. DPAR_AMP_ACTIVATIONS=f32 casts each autocast result
// back to f32 instead (only the products in half precision).
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

// The dtype set by the innermost Autocast scope on this thread; f32 when off.
DType autocast_dtype();

// How this CPU runs amp::Autocast(bf16)'s CPU ops (oneDNN's bf16 kernels): natively with
// AVX512-BF16 (or AMX), emulated in f32 arithmetic with AVX-512 alone (correct, slower than f32),
// not at all without AVX-512 (CPU ops under Autocast(bf16) then fail naming the CPU).
enum class CpuBf16 { unsupported, emulated, native };
CpuBf16 cpu_bf16_support();

}  // namespace dpar::amp
