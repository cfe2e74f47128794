#include "core/cuda_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "dpar/core/error.h"
#include "tensor/dispatch.h"

namespace dpar::detail {
namespace {

#ifdef DPAR_WITH_CUDA
// DPAR_CUDA_BACKEND_FILE is libdpar_cuda's soname ("libdpar_cuda.so.0"), set by lib/CMakeLists.
constexpr const char* kBackendFile = DPAR_CUDA_BACKEND_FILE;

// The folder libdpar was loaded from: libdpar_cuda is installed, built and bundled beside it.
std::string libdpar_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cuda_backend), &info) == 0 || !info.dli_fname) {
    return {};
  }
  return std::filesystem::path(info.dli_fname).parent_path().string();
}
#endif

struct LoadedBackend {
  const CudaBackendApi* api = nullptr;
  std::string error;
};

LoadedBackend load_backend() {
#ifndef DPAR_WITH_CUDA
  return {nullptr, "dpar was built without CUDA"};
#else
  // DPAR_CUDA_BACKEND names the file where set (another build of the backend); else the one
  // beside libdpar; then the loader's own search (LD_LIBRARY_PATH, the runpath). Where a file is
  // there but does not load, its error (a missing cuDNN, say) is the one to report.
  void* handle = nullptr;
  std::string error;
  if (const char* chosen = std::getenv("DPAR_CUDA_BACKEND"); chosen && *chosen) {
    handle = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      return {nullptr,
              std::string("the CUDA backend cannot be loaded (DPAR_CUDA_BACKEND): ") + dlerror()};
    }
  }
  const std::string folder = libdpar_folder();
  const std::string beside = folder.empty() ? "" : folder + "/" + kBackendFile;
  if (!handle && !beside.empty() && std::filesystem::exists(beside)) {
    handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) error = dlerror();
  }
  if (!handle) {
    handle = dlopen(kBackendFile, RTLD_NOW | RTLD_LOCAL);
    if (!handle && error.empty()) error = dlerror();
  }
  if (!handle) return {nullptr, std::string("the CUDA backend cannot be loaded: ") + error};
  using Entry = const CudaBackendApi* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "dpar_cuda_backend_api"));
  if (!entry) {
    return {nullptr, std::string("the CUDA backend ") + kBackendFile +
                         " has no dpar_cuda_backend_api: not a dpar CUDA backend"};
  }
  const CudaBackendApi* api = entry();
  if (api->version != kCudaBackendApiVersion) {
    return {nullptr, std::string("the CUDA backend ") + kBackendFile +
                         " is from another dpar "
                         "build (backend interface " +
                         std::to_string(api->version) + ", this libdpar expects " +
                         std::to_string(kCudaBackendApiVersion) + ")"};
  }
  // The CPU backend first, the order in which the backends have always registered.
  ensure_backends_registered();
  api->register_backend();
  return {api, ""};
#endif
}

const LoadedBackend& loaded() {
  static const LoadedBackend backend = load_backend();  // once, thread-safe
  return backend;
}

}  // namespace

const CudaBackendApi* cuda_backend() { return loaded().api; }

std::string cuda_backend_error() { return loaded().error; }

bool cuda_backend_loaded() {
#ifdef DPAR_WITH_CUDA
  void* handle = dlopen(kBackendFile, RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);  // drops only the reference RTLD_NOLOAD took
  return handle != nullptr;
#else
  return false;
#endif
}

}  // namespace dpar::detail
