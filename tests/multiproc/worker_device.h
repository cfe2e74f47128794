#pragma once
// The device a test worker runs on, shared by collectives_worker and ddp_worker.
#include <cstdlib>
#include <string>

#include "dpar/core/device.h"

namespace dpar::test {

// --device, else $DPAR_TEST_DEVICE (the GPU test wrapper sets it), else cpu; checked usable.
inline Device worker_device(const std::string& flag) {
  const char* env = std::getenv("DPAR_TEST_DEVICE");
  const Device device = Device::parse(!flag.empty() ? flag : env != nullptr ? env : "cpu");
  check_device_available(device);
  return device;
}

// Several ranks on one GPU: NCCL refuses two ranks on one device of one host, but ranks whose
// NCCL_HOSTID differs count as different hosts and talk over its socket transport. Each rank
// sets its own id before its first collective creates the communicator (test setups only:
// tests/gpu/gpu_mp.sh asks for it with DPAR_TEST_NCCL_HOST_PER_RANK=1).
inline void distinct_nccl_host_if_asked(int rank) {
  const char* asked = std::getenv("DPAR_TEST_NCCL_HOST_PER_RANK");
  if (asked == nullptr || std::string(asked) != "1") return;
  const std::string id = "dpar-test-host-" + std::to_string(rank);
  setenv("NCCL_HOSTID", id.c_str(), 1);
}

}  // namespace dpar::test
