// Streams, device guards and error reporting for the CUDA backend.
#include "tensor/cuda/cuda_context.h"

#include <cuda_profiler_api.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "tensor/cuda/backend.h"
#include "tensor/cuda/deferred_error.h"
#include "tensor/dispatch.h"

namespace dpar::cuda {
namespace {

constexpr int kMaxDevices = 64;

// Whether any device's stream exists yet: the profiler's device wait must not create a CUDA
// context in a process that never used the GPU.
std::atomic<bool> any_stream_created{false};

// One default stream per device for the whole process: every thread that does not set a side
// stream runs its kernels there, so work issued by different threads stays ordered the way
// PyTorch's default stream orders it.
cudaStream_t default_stream(int device) {
  static std::array<cudaStream_t, kMaxDevices> streams{};
  static std::array<std::once_flag, kMaxDevices> once;
  DPAR_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device, " out of range");
  std::call_once(once[static_cast<size_t>(device)], [device] {
    int previous = 0;
    check(cudaGetDevice(&previous), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&streams[static_cast<size_t>(device)], cudaStreamNonBlocking),
          "cudaStreamCreate");
    check(cudaSetDevice(previous), "cudaSetDevice");
    any_stream_created = true;
  });
  return streams[static_cast<size_t>(device)];
}

// Side streams set by StreamGuard on this thread (null: the device's default stream).
thread_local std::array<cudaStream_t, kMaxDevices> tls_stream{};

}  // namespace

const char* last_kernel() { return detail::last_cuda_kernel; }

void wait_for_device_work() {
  if (any_stream_created) (void)cudaDeviceSynchronize();
}

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so the next call is not blamed
  DPAR_FAIL("CUDA error in ", what, " (last kernel: ", last_kernel(),
            "): ", cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

cudaStream_t current_stream(int device) {
  DPAR_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device, " out of range");
  cudaStream_t s = tls_stream[static_cast<size_t>(device)];
  return s ? s : default_stream(device);
}

cudaStream_t current_stream() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return current_stream(device);
}

cudaStream_t communication_stream(int device) {
  DPAR_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device, " out of range");
  constexpr size_t kPoolSize = 4;
  static std::mutex mutex;
  static std::array<std::array<cudaStream_t, kPoolSize>, kMaxDevices> pools{};
  static std::array<size_t, kMaxDevices> handed_out{};
  std::lock_guard<std::mutex> lock(mutex);
  const size_t d = static_cast<size_t>(device);
  cudaStream_t& slot = pools[d][handed_out[d]++ % kPoolSize];
  if (slot == nullptr) {
    int previous = 0, least = 0, greatest = 0;
    check(cudaGetDevice(&previous), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
    // The highest priority lets a bucket's all-reduce start while backward kernels queue up.
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&slot, cudaStreamNonBlocking, greatest),
          "cudaStreamCreateWithPriority");
    check(cudaSetDevice(previous), "cudaSetDevice");
  }
  return slot;
}

StreamGuard::StreamGuard(int device, cudaStream_t stream)
    : device_(device), previous_(tls_stream.at(static_cast<size_t>(device))) {
  tls_stream[static_cast<size_t>(device)] = stream;
}
StreamGuard::~StreamGuard() { tls_stream[static_cast<size_t>(device_)] = previous_; }

DeviceGuard::DeviceGuard(Device device) {
  DPAR_CHECK(device.is_cuda(), "DeviceGuard needs a CUDA device, got ", device.str());
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device.index) {
    check(cudaSetDevice(device.index), "cudaSetDevice");
    previous_ = current;
  }
}
DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

void synchronize(int device) {
  check(cudaStreamSynchronize(current_stream(device)), "stream synchronisation");
  // Errors kernels found in the data (bad target indices) surface here, without a sync each.
  raise_deferred_errors(device);
}

}  // namespace dpar::cuda

// ---- the device queries behind dpar/core/device.h ------------------------------------------
// libdpar's public functions (core/device.cpp) reach these through the backend table
// (backend_entry.cpp), so they run only once libdpar_cuda is loaded.
namespace dpar::cuda {

namespace {
// cudaGetDeviceCount's status, cached: it initialises the runtime once per process.
cudaError_t device_count_status(int* count) {
  static int cached = 0;
  static const cudaError_t status = [] {
    const cudaError_t s = cudaGetDeviceCount(&cached);
    (void)cudaGetLastError();
    return s;
  }();
  *count = status == cudaSuccess ? cached : 0;
  return status;
}
}  // namespace

int device_count() {
  int count = 0;
  device_count_status(&count);
  return count;
}

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t status = device_count_status(&count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) {
    return "no CUDA device (cudaGetDeviceCount found none)";
  }
  // Without the NVIDIA driver the runtime says "driver version is insufficient"; say what is
  // actually missing.
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
    dlclose(driver);
  } else if (void* loaded = dlopen("libcuda.so.1", RTLD_LAZY)) {
    dlclose(loaded);
  } else {
    return "no NVIDIA driver (libcuda.so.1 cannot be loaded), so no CUDA device";
  }
  if (status != cudaSuccess) {
    return std::string("CUDA is not usable here: ") + cudaGetErrorName(status) + ": " +
           cudaGetErrorString(status);
  }
  return {};
}

void synchronize_device(Device device) {
  if (device.is_cpu()) return;
  DeviceGuard guard(device);
  synchronize(device.index);
}

CudaDeviceInfo device_info(Device device) {
  CudaDeviceInfo info;
  if (device.is_cpu() || device_count() <= device.index) return info;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device.index), "cudaGetDeviceProperties");
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  };
  const size_t cudnn = cudnnGetVersion();
  info.runtime_version = version(runtime);
  info.driver_version = version(driver);
  info.cudnn_version = std::to_string(cudnn / 10000) + "." + std::to_string((cudnn % 10000) / 100) +
                       "." + std::to_string(cudnn % 100);
  info.name = prop.name;
  info.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return info;
}

void set_profiler_capture(bool capture) {
  if (device_count() == 0) return;
  check(capture ? cudaProfilerStart() : cudaProfilerStop(),
        capture ? "cudaProfilerStart" : "cudaProfilerStop");
}

}  // namespace dpar::cuda
