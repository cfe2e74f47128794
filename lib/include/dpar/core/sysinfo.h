#pragma once
// Facts about the machine and process for logs and benchmark reports.
#include <string>

namespace dpar::sysinfo {

std::string cpu_model();     // "AMD EPYC 7B13" (from /proc/cpuinfo), or "unknown"
std::string os_name();       // PRETTY_NAME from /etc/os-release, or the kernel name
int cpu_cores();             // online cores
double peak_rss_mb();        // peak resident set of this process
double current_rss_mb();     // current resident set of this process
std::string hostname();

}  // namespace dpar::sysinfo
