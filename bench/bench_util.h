#pragma once
// Shared pieces of the benchmarks: running a PyTorch peer script in the same invocation and
// reading its one-line JSON answer, timing loops, and the result table.
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "dpar/core/error.h"

namespace dpar::bench {

// Runs `/usr/bin/python3 bench/peers/<script> <args>` with OMP_NUM_THREADS=threads and
// returns the JSON object printed on its last stdout line.
inline nlohmann::json run_peer(const std::string& script, const std::string& args, int threads) {
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " MKL_NUM_THREADS=" +
                          std::to_string(threads) + " /usr/bin/python3 " DPAR_SOURCE_DIR
                          "/bench/peers/" + script + " " + args + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  DPAR_CHECK(pipe != nullptr, "bench: cannot start the PyTorch peer: ", cmd);
  std::string out, last;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pclose(pipe);
  DPAR_CHECK(status == 0, "bench: PyTorch peer failed (status ", status, "): ", cmd);
  size_t end = out.find_last_not_of('\n');
  size_t start = out.rfind('\n', end);
  last = out.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  return nlohmann::json::parse(last);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dpar::bench
