#pragma once
// Shared pieces of the benchmarks: running a PyTorch peer script in the same invocation and
// reading its one-line JSON answer, timing loops, the result table, and what the self-launching
// benchmarks need (their own path, free loopback ports).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dpar/core/error.h"
#include "dpar/core/random.h"
#include "dpar/tensor/tensor.h"

namespace dpar::bench {

// Where the peers and their Python are: DPAR_PEER_DIR / DPAR_PEER_PYTHON when set, else the
// source tree's bench/peers (or ./bench/peers, for a bundle run from a checkout on the GPU
// machine) and Debian's /usr/bin/python3 (or the python3 on PATH, which holds PyTorch there).
inline std::string peer_dir() {
  if (const char* d = std::getenv("DPAR_PEER_DIR"); d && *d) return d;
  if (std::ifstream(DPAR_SOURCE_DIR "/bench/peers/torch_train_step.py")) {
    return DPAR_SOURCE_DIR "/bench/peers";
  }
  return "bench/peers";
}
inline std::string peer_python() {
  if (const char* p = std::getenv("DPAR_PEER_PYTHON"); p && *p) return p;
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

// The loader path a peer runs with: DPAR_PEER_LD_LIBRARY_PATH where set (scripts/gpu-run.sh sets
// it to the machine's own path, before it puts the bundle's libraries first: PyTorch must not
// load the bundle's libstdc++, libssl or libz), else the inherited one.
inline std::string peer_environment() {
  const char* path = std::getenv("DPAR_PEER_LD_LIBRARY_PATH");
  if (path == nullptr) return "";
  if (*path == '\0') return "env -u LD_LIBRARY_PATH ";
  std::string quoted = "'";
  for (const char* c = path; *c; ++c)
    quoted += *c == '\'' ? std::string("'\\''") : std::string(1, *c);
  return "env LD_LIBRARY_PATH=" + quoted + "' ";
}

// Runs a shell command and returns the JSON object on its last stdout line (stderr to ours).
inline nlohmann::json run_command_json(const std::string& cmd) {
  FILE* pipe = popen(cmd.c_str(), "r");
  DPAR_CHECK(pipe != nullptr, "bench: cannot start: ", cmd);
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pclose(pipe);
  DPAR_CHECK(status == 0, "bench: failed (status ", status, "): ", cmd);
  const size_t end = out.find_last_not_of('\n');
  DPAR_CHECK(end != std::string::npos, "bench: no output from: ", cmd);
  const size_t start = out.rfind('\n', end);
  const size_t from = start == std::string::npos ? 0 : start + 1;
  return nlohmann::json::parse(out.substr(from, end - from + 1));
}

// Runs `<program> <peer dir>/<script> <args>` with OMP_NUM_THREADS=threads and returns the JSON
// object printed on its last stdout line. The peer's stderr goes to ours, so its warnings and
// tracebacks stay in the benchmark's log.
inline nlohmann::json run_peer_program(const std::string& program, const std::string& script,
                                       const std::string& args, int threads) {
  return run_command_json(peer_environment() + "OMP_NUM_THREADS=" + std::to_string(threads) +
                          " MKL_NUM_THREADS=" + std::to_string(threads) + " " + program + " " +
                          peer_dir() + "/" + script + " " + args);
}

// A PyTorch peer: the script run by peer_python().
inline nlohmann::json run_peer(const std::string& script, const std::string& args, int threads) {
  return run_peer_program(peer_python(), script, args, threads);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "0.52 0.61 0.70" from /proc/loadavg: benchmarks print it before and after, so a reader can
// tell a quiet run from a busy one.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

inline double median(std::vector<double> v) {
  DPAR_CHECK(!v.empty(), "bench: median of nothing");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// A random image batch (normal pixels) and labels in [0, classes), reproducible from seed; the
// images in `format` (the CPU peers take theirs channels-last, converted before their timing, and
// so does dpar then: its convolutions read channels-last).
struct RandomBatch {
  Tensor images;
  Tensor labels;
};
inline RandomBatch random_batch(int64_t batch, int64_t img, int64_t classes, uint64_t seed,
                                MemoryFormat format = MemoryFormat::Contiguous) {
  Generator gen(seed);
  std::vector<float> xv(static_cast<size_t>(batch * 3 * img * img));
  for (float& v : xv) v = gen.normal();
  std::vector<int64_t> yv(static_cast<size_t>(batch));
  for (auto& v : yv) v = static_cast<int64_t>(gen.next_u64() % static_cast<uint64_t>(classes));
  return {Tensor::from_vector(xv, {batch, 3, img, img}).contiguous(format),
          Tensor::from_vector(yv, {batch})};
}

// This executable's absolute path (for re-running itself under dpar-launch).
inline std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  DPAR_CHECK(n > 0, "bench: cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

inline bool loopback_port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

// A message size as the all-reduce tables print it: "64 KB", "1 MB", "256 MB".
inline std::string size_text(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%g MB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%g KB", static_cast<double>(bytes) / 1024);
  }
  return buf;
}

// The first of `count` consecutive loopback ports that are all free now, from a random start in
// 30000-55000, so concurrent runs (tests, other benchmarks) do not collide.
inline int pick_free_ports(int count) {
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = 30000 + static_cast<int>(rng() % 2500) * 10;
    bool free = true;
    for (int p = base; free && p < base + count; ++p) free = loopback_port_free(p);
    if (free) return base;
  }
  DPAR_FAIL("bench: found no free block of ", count, " loopback ports in 30000-55000");
}

}  // namespace dpar::bench
