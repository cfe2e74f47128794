#include "dpar/core/error.h"

#include <cstring>

namespace dpar::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  // Keep only the path below lib/ etc. so messages stay short but still locate the check.
  const char* short_file = file;
  for (const char* marker : {"/lib/src/", "/launch/", "/examples/", "/tests/", "/bench/"}) {
    if (const char* p = std::strstr(file, marker)) {
      short_file = p + 1;
      break;
    }
  }
  throw Error(message + " [" + short_file + ":" + std::to_string(line) + "]");
}

}  // namespace dpar::detail
