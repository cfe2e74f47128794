#pragma once
// Shared pieces of the benchmarks: running a PyTorch peer script in the same invocation and
// reading its one-line JSON answer, timing loops, and the result table.
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "dpar/core/error.h"
#include "dpar/core/random.h"
#include "dpar/tensor/tensor.h"

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

// A random image batch (normal pixels) and labels in [0, classes), reproducible from seed.
struct RandomBatch {
  Tensor images;
  Tensor labels;
};
inline RandomBatch random_batch(int64_t batch, int64_t img, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> xv(static_cast<size_t>(batch * 3 * img * img));
  for (float& v : xv) v = gen.normal();
  std::vector<int64_t> yv(static_cast<size_t>(batch));
  for (auto& v : yv) v = static_cast<int64_t>(gen.next_u64() % static_cast<uint64_t>(classes));
  return {Tensor::from_vector(xv, {batch, 3, img, img}), Tensor::from_vector(yv, {batch})};
}

}  // namespace dpar::bench
