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
}  // namespace cpu

namespace detail {

void register_cpu_backend() {
  register_allocator(DeviceType::CPU, cpu_caching_allocator());
  cpu::register_core_kernels();
  cpu::register_elementwise_kernels();
}

}  // namespace detail
}  // namespace dpar
