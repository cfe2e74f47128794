#include "dpar/core/sysinfo.h"

#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace dpar::sysinfo {
namespace {

std::string trim(std::string s) {
  const size_t b = s.find_first_not_of(" \t\"");
  const size_t e = s.find_last_not_of(" \t\"\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string field(const char* path, const std::string& key, char sep) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const size_t p = line.find(sep);
      if (p != std::string::npos) return trim(line.substr(p + 1));
    }
  }
  return "";
}

}  // namespace

std::string cpu_model() {
  std::string m = field("/proc/cpuinfo", "model name", ':');
  return m.empty() ? "unknown" : m;
}

std::string os_name() {
  std::string name = field("/etc/os-release", "PRETTY_NAME", '=');
  if (!name.empty()) return name;
  utsname u{};
  return uname(&u) == 0 ? std::string(u.sysname) + " " + u.release : "unknown";
}

int cpu_cores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

double current_rss_mb() {
  std::ifstream in("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  in >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

std::string hostname() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : "unknown";
}

}  // namespace dpar::sysinfo
