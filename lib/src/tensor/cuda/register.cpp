// Fills the CUDA kernel slots. Each kernel family (one .cu file) defines its register
// function; the host-side libraries (cuDNN, cuBLAS) register from their .cpp files.
#include "dpar/core/profiler.h"
#include "dpar/tensor/allocator.h"
#include "tensor/cuda/backend.h"
#include "tensor/cuda/cuda_allocator.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/dispatch.h"

namespace dpar {
namespace cuda {
void register_core_kernels();
void register_elementwise_kernels();
void register_unary_kernels();
void register_pool_kernels();
void register_norm_kernels();
void register_conv_kernels();
void register_linear_kernels();
void register_softmax_kernels();
void register_optim_kernels();
void register_optim_multi_kernels();
void register_amp_kernels();
void register_pinned_memory();
void register_index_kernels();
void register_layer_norm_kernels();
void register_window_pool_kernels();

void register_backend() {
  register_allocator(DeviceType::CUDA, device_allocator());
  register_core_kernels();
  register_elementwise_kernels();
  register_unary_kernels();
  register_pool_kernels();
  register_norm_kernels();
  register_conv_kernels();
  register_linear_kernels();
  register_softmax_kernels();
  register_optim_kernels();
  register_optim_multi_kernels();
  register_amp_kernels();
  register_pinned_memory();
  register_index_kernels();
  register_layer_norm_kernels();
  register_window_pool_kernels();
  profiler::set_device_sync(&wait_for_device_work);
}

}  // namespace cuda
}  // namespace dpar
