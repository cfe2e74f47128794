// Fills the CPU kernel slots. Each kernel family defines its own register function.
#include "dpar/tensor/allocator.h"
#include "tensor/dispatch.h"

namespace dpar {
namespace detail {
Allocator* cpu_caching_allocator();
}  // namespace detail

namespace cpu {
void register_core_kernels();
void register_elementwise_kernels();
void register_nn_kernels();
void register_unary_kernels();
void register_linear_kernels();
void register_softmax_kernels();
void register_optim_kernels();
void register_amp_kernels();
void register_index_kernels();
void register_layer_norm_kernels();
void register_window_pool_kernels();
void register_attention_kernels();
}  // namespace cpu

namespace detail {

void register_cpu_backend() {
  register_allocator(DeviceType::CPU, cpu_caching_allocator());
  cpu::register_core_kernels();
  cpu::register_elementwise_kernels();
  cpu::register_nn_kernels();
  cpu::register_unary_kernels();
  cpu::register_linear_kernels();
  cpu::register_softmax_kernels();
  cpu::register_optim_kernels();
  cpu::register_amp_kernels();
  cpu::register_index_kernels();
  cpu::register_layer_norm_kernels();
  cpu::register_window_pool_kernels();
  cpu::register_attention_kernels();
}

}  // namespace detail
}  // namespace dpar
