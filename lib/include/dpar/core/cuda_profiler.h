#pragma once

namespace dpar {

// Starts (true) or stops (false) the CUDA profilers' capture (cudaProfilerStart/Stop), so that
// `ncu --profile-from-start off` records only the work queued in between. No-op without CUDA
// or without a device.
void set_cuda_profiler_capture(bool capture);

}  // namespace dpar
