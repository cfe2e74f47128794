// Fills the CUDA kernel slots. Each kernel family (one .cu file) defines its register
// function; the host-side libraries (cuDNN, cuBLAS) register from their .cpp files.
#include "dpar/core/profiler.h"
#include "dpar/tensor/allocator.h"
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
}  // namespace cuda

namespace detail {

void register_cuda_backend() {
  register_allocator(DeviceType::CUDA, cuda::device_allocator());
  cuda::register_core_kernels();
  cuda::register_elementwise_kernels();
  cuda::register_unary_kernels();
  cuda::register_pool_kernels();
  cuda::register_norm_kernels();
  cuda::register_conv_kernels();
  cuda::register_linear_kernels();
  cuda::register_softmax_kernels();
  cuda::register_optim_kernels();
  cuda::register_optim_multi_kernels();
  cuda::register_amp_kernels();
  cuda::register_pinned_memory();
  cuda::register_index_kernels();
  cuda::register_layer_norm_kernels();
  cuda::register_window_pool_kernels();
  profiler::set_device_sync(&cuda::wait_for_device_work);
}

}  // namespace detail
}  // namespace dpar
