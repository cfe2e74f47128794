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

}  // namespace dpar
