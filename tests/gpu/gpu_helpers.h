#pragma once
// Shared by the GPU tests: the skip rule, random inputs and CPU-vs-CUDA comparisons.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dpar/dpar.h"
#include "tensor_compare.h"

// Without a usable GPU the test prints the reason (ctest's SKIP_REGULAR_EXPRESSION turns it
// into "skipped") and returns. Where a GPU must be there (DPAR_GPU_REQUIRED=1, which
// scripts/gpu-run.sh sets on a machine whose nvidia-smi lists one) that is a failure instead:
// a GPU run where every test skipped must not read as passed.
inline bool gpu_required() {
  const char* v = std::getenv("DPAR_GPU_REQUIRED");
  return v != nullptr && std::string(v) == "1";
}
#define DPAR_REQUIRE_GPU()                                                                     \
  do {                                                                                         \
    if (dpar::cuda_device_count() == 0) {                                                      \
      if (gpu_required()) FAIL("DPAR_GPU_REQUIRED=1 but " << dpar::cuda_unavailable_reason()); \
      std::printf("dpar-gpu-test-skipped: %s\n", dpar::cuda_unavailable_reason().c_str());     \
      return;                                                                                  \
    }                                                                                          \
  } while (0)

inline const dpar::Device kGpu = dpar::Device::cuda(0);

using GpuOpFn = std::function<dpar::Tensor(const std::vector<dpar::Tensor>&)>;

// Runs op on the CPU and on the GPU with the same inputs; checks the outputs and the input
// gradients of sum(out * r) for a fixed random r to `tol` relative (f32: 1e-4).
inline void compare_op(const char* name, const GpuOpFn& op, const std::vector<dpar::Tensor>& inputs,
                       double tol = 1e-4) {
  using namespace dpar;
  INFO(name);
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    const bool grad = is_floating(t.dtype());
    cpu_in.push_back(grad ? leaf_on(t, Device::cpu()) : t);
    gpu_in.push_back(grad ? leaf_on(t, kGpu) : t.to(kGpu));
  }
  Tensor cpu_out = op(cpu_in), gpu_out = op(gpu_in);
  REQUIRE(gpu_out.device() == kGpu);
  CHECK(relative_error(cpu_out, gpu_out) <= tol);
  if (!cpu_out.requires_grad()) return;
  const Tensor r = random_tensor(cpu_out.shape(), 99);
  sum(cpu_out * r).backward();
  sum(gpu_out * r.to(kGpu)).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_in[i].requires_grad() || !cpu_in[i].grad().defined()) continue;
    INFO("gradient of input " << i);
    REQUIRE(gpu_in[i].grad().defined());
    CHECK(relative_error(cpu_in[i].grad(), gpu_in[i].grad()) <= tol);
  }
}
