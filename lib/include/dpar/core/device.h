#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace dpar {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  // Parses "cpu", "gpu", "cuda", "cuda:1", "gpu:1"; throws dpar::Error otherwise.
  static Device parse(const std::string& text);
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// True when this build contains the CUDA backend (DPAR_WITH_CUDA).
bool built_with_cuda();

// CUDA devices this process can use (after CUDA_VISIBLE_DEVICES); 0 without CUDA, without a
// driver or without a GPU. Never throws.
int cuda_device_count();
// Why cuda_device_count() is 0, as one line ("dpar was built without CUDA", "no CUDA driver:
// ...", "no CUDA device"); empty when there is a device.
std::string cuda_unavailable_reason();
// Throws dpar::Error naming the device when `device` is a CUDA device this process cannot use
// (bad index, no GPU, built without CUDA). CPU devices pass.
void check_device_available(Device device);
// Waits for the work queued on the device's current stream; a kernel fault that happened
// there surfaces as a dpar::Error naming the last kernel. No-op for the CPU.
void synchronize(Device device);
// "CUDA runtime 13.0, driver 13.0, cuDNN 9.x, NVIDIA H100 80GB HBM3, 79.2 GiB" for reports;
// empty without a device.
std::string cuda_device_summary(Device device);
// The same facts one by one (all empty / 0 without a device).
struct CudaDeviceInfo {
  std::string runtime_version;  // "13.0"
  std::string driver_version;   // "13.0" (the CUDA version the driver supports)
  std::string cudnn_version;    // "9.10.2"
  std::string name;             // "NVIDIA H100 80GB HBM3"
  double memory_gib = 0;
};
CudaDeviceInfo cuda_device_info(Device device);

}  // namespace dpar
