#pragma once
// Small string helpers shared by the launcher's parsers.
#include <string>
#include <vector>

namespace dpar::launch {

// Splits on `sep`, trimming spaces around each item; "" gives no items, "a,,b" keeps the
// empty middle item so callers can reject it.
std::vector<std::string> split(const std::string& text, char sep);
std::vector<std::string> split_whitespace(const std::string& text);
std::string trim(const std::string& text);
std::string join(const std::vector<std::string>& items, const std::string& sep);
// True for a non-empty string of decimal digits.
bool is_uint(const std::string& text);

}  // namespace dpar::launch
