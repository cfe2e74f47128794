#pragma once
// Runs a lowered Program with dpar's tensor ops instead of oneDNN primitives, on any device
// the ops support: the GPU path of dpar::infer (cuDNN convolutions, cuBLAS Gemm, the CUDA
// elementwise kernels). On the CPU it is the reference the oneDNN plan is tested against.
#include <vector>

#include "infer/graph.h"

namespace dpar::infer::detail {

class OpExecutor {
 public:
  // Copies the program's weights and constants to `device` once (convolution weights
  // channels-last on a GPU, the layout conv2d uses there). Throws dpar::Error naming the first
  // op it cannot run: int8 (QDQ) Conv/Gemm, asymmetric convolution padding.
  // compute: f32, or f16/bf16 for convolutions and Gemm under amp::Autocast (CUDA only).
  OpExecutor(const Program& program, Device device, DType compute = DType::f32);

  // input: f32 of the program's input rank, on any device; the result is on device().
  Tensor run(const Tensor& input) const;
  Device device() const { return device_; }
  DType compute() const { return compute_; }

 private:
  const Program& program_;
  Device device_;
  DType compute_;
  std::vector<Tensor> constants_;  // by value id, on device_
  std::vector<Tensor> weights_;    // by op
  std::vector<Tensor> biases_;     // by op
};

}  // namespace dpar::infer::detail
