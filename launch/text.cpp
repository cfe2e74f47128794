#include "text.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace dpar::launch {

// The characters isspace() knows, as split_whitespace's stream does: a line of only '\v' or
// '\f' is blank for both (fuzz_launch_parse found a hostfile line trim() kept but split into
// no tokens).
constexpr const char* kWhitespace = " \t\r\n\v\f";

std::string trim(const std::string& text) {
  const size_t b = text.find_first_not_of(kWhitespace);
  if (b == std::string::npos) return "";
  const size_t e = text.find_last_not_of(kWhitespace);
  return text.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  if (trim(text).empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t pos = text.find(sep, start);
    out.push_back(trim(text.substr(start, pos == std::string::npos ? pos : pos - start)));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

std::vector<std::string> split_whitespace(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string token; in >> token;) out.push_back(token);
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

bool is_uint(const std::string& text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace dpar::launch
