#pragma once
// Shared by the launcher's unit tests: options from a flag list, and the FlagError text of a
// call.
#include <functional>
#include <string>
#include <vector>

#include "dpar/core/flags.h"
#include "options.h"

namespace dpar::launch::testing {

inline Options options(std::vector<std::string> args) {
  args.push_back("prog");
  return parse_options(args);
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dpar::FlagError& e) {
    return e.what();
  }
  return "(no FlagError)";
}

}  // namespace dpar::launch::testing
