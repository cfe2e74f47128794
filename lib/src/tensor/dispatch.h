#pragma once
// The single dispatch point between ops and device backends. Each kernel is a slot with one
// function pointer per device type; backends fill their slots at registration time. An op
// calls KERNEL.get(device)(args...) and gets either the backend's function or an error that
// names the kernel and the device. Adding a backend (CUDA) means filling slots, not editing ops.
#include <array>
#include <string>

#include "dpar/core/device.h"
#include "dpar/core/error.h"

namespace dpar::detail {

// The kernel slot last dispatched to a CUDA device on this thread: CUDA faults surface
// asynchronously, at the next synchronisation, and the error names this kernel.
inline thread_local const char* last_cuda_kernel = "none";

// Registers the CPU backend once. The CUDA backend is a library of its own, loaded and
// registered the first time a CUDA device is used (core/cuda_backend.h).
void ensure_backends_registered();
// Loads and registers the CUDA backend once; false when there is none (why: cuda_backend_error).
bool ensure_cuda_backend();
// " (<why the CUDA backend is missing>)" for a CUDA device when it is, else "".
std::string missing_backend_note(Device device);

template <class Fn>
class KernelSlot {
 public:
  using Signature = Fn;
  explicit constexpr KernelSlot(const char* name) : name_(name) {}
  void set(DeviceType type, Fn* fn) { table_[static_cast<int>(type)] = fn; }
  Fn* get(Device device) const {
    ensure_backends_registered();
    if (device.type == DeviceType::CUDA) {
      ensure_cuda_backend();
      last_cuda_kernel = name_;
    }
    Fn* fn = table_[static_cast<int>(device.type)];
    if (!fn) {
      DPAR_FAIL("kernel ", name_, " is not available on device ", device.str(),
                missing_backend_note(device));
    }
    return fn;
  }
  // Whether a backend filled the slot for this device (for ops with an optional fast path).
  bool available(Device device) const {
    ensure_backends_registered();
    if (device.type == DeviceType::CUDA) ensure_cuda_backend();
    return table_[static_cast<int>(device.type)] != nullptr;
  }
  const char* name() const { return name_; }

 private:
  const char* name_;
  std::array<Fn*, kNumDeviceTypes> table_{};
};

// The CPU backend's registration, called once by ensure_backends_registered().
void register_cpu_backend();

}  // namespace dpar::detail

// Declares a kernel slot in a header: DPAR_KERNEL(relu_fwd, void(const Tensor&, Tensor&));
#define DPAR_KERNEL(name, ...) \
  inline ::dpar::detail::KernelSlot<__VA_ARGS__> name { #name }
