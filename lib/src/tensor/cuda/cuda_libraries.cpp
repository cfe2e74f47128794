// Per-thread, per-device cuBLAS and cuDNN handles and a shared workspace.
#include "tensor/cuda/cuda_libraries.h"

#include <array>
#include <memory>

#include "dpar/tensor/storage.h"
#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_context.h"

namespace dpar::cuda {
namespace {

constexpr size_t kMaxDevices = 64;

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  DPAR_CHECK(device >= 0 && static_cast<size_t>(device) < kMaxDevices, "CUDA device ", device,
             " out of range");
  return device;
}

struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> cublas{};
  std::array<cudnnHandle_t, kMaxDevices> cudnn{};
  std::array<std::unique_ptr<Storage>, kMaxDevices> workspace;
  // Handles die with the thread; at process exit the driver may already be gone, so errors
  // are ignored.
  ~ThreadHandles() {
    for (auto h : cublas)
      if (h) cublasDestroy(h);
    for (auto h : cudnn)
      if (h) cudnnDestroy(h);
  }
};
thread_local ThreadHandles tls;

}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  DPAR_FAIL("cuBLAS error in ", what, " (last kernel: ", last_kernel(),
            "): ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
}

cudnnDataType_t cudnn_data_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      DPAR_FAIL("cuDNN takes f32, f16 and bf16 here, got ", t);
  }
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  DPAR_FAIL("cuDNN error in ", what, " (last kernel: ", last_kernel(),
            "): ", cudnnGetErrorString(status), detail[0] ? ": " : "", detail);
}

cublasHandle_t cublas_handle() {
  const int device = current_device();
  cublasHandle_t& h = tls.cublas[static_cast<size_t>(device)];
  if (!h) {
    check_cublas(cublasCreate(&h), "cublasCreate");
    // TF32 tensor cores off by default, like PyTorch's allow_tf32 = False for matmuls: f32
    // results then match the CPU backend to 1e-5.
    check_cublas(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  check_cublas(cublasSetStream(h, current_stream(device)), "cublasSetStream");
  return h;
}

cudnnHandle_t cudnn_handle() {
  const int device = current_device();
  cudnnHandle_t& h = tls.cudnn[static_cast<size_t>(device)];
  if (!h) check_cudnn(cudnnCreate(&h), "cudnnCreate");
  check_cudnn(cudnnSetStream(h, current_stream(device)), "cudnnSetStream");
  return h;
}

void* workspace(size_t nbytes) {
  const int device = current_device();
  auto& ws = tls.workspace[static_cast<size_t>(device)];
  if (nbytes == 0) return nullptr;
  if (!ws || ws->nbytes() < nbytes) {
    ws.reset();  // back to the stream-ordered pool before the larger one is taken
    ws = std::make_unique<Storage>(nbytes, Device::cuda(device));
  }
  // Used on another stream than it was allocated on (a side stream): it is then freed only
  // after that stream's work too (a no-op for the allocating stream).
  record_stream(ws->data(), current_stream(device));
  return ws->data();
}

void release_workspace() { tls.workspace[static_cast<size_t>(current_device())].reset(); }

}  // namespace dpar::cuda
