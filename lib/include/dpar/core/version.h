#pragma once
#include <string>

namespace dpar {

std::string version();     // "0.1.0"
std::string git_commit();  // short hash of the build's commit, or "unknown"

}  // namespace dpar
