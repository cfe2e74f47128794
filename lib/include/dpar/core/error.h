#pragma once
// dpar::Error and the check macros used everywhere. Errors carry what failed, the offending
// values and the source location, so a tool can print one clear line and exit non-zero.
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dpar {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline void append_to(std::ostringstream& os, const std::vector<int64_t>& shape) {
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << ']';
}
template <class T>
void append_to(std::ostringstream& os, const T& value) {
  os << value;
}

// Concatenates any streamable values; shapes (vector<int64_t>) print as [a,b,c].
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (append_to(os, args), ...);
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace dpar

// DPAR_CHECK(cond, "conv2d: expected 4-D input, got ", x.shape()) throws dpar::Error.
#define DPAR_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::dpar::detail::throw_error(__FILE__, __LINE__, ::dpar::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define DPAR_FAIL(...) \
  ::dpar::detail::throw_error(__FILE__, __LINE__, ::dpar::detail::str_cat(__VA_ARGS__))
