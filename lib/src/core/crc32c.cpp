#include "core/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstdio>

namespace dpar::detail {

Crc32c& Crc32c::add(const void* data, size_t size) {
  // ISA-L takes the length as an int, so long inputs go in pieces.
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t piece = std::min<size_t>(size, size_t{1} << 30);
    state_ = crc32_iscsi(const_cast<uint8_t*>(p), static_cast<int>(piece), state_);
    p += piece;
    size -= piece;
  }
  return *this;
}

std::string crc_pair(uint32_t got, uint32_t expected) {
  char text[24];
  std::snprintf(text, sizeof text, "%08x != %08x", got, expected);
  return text;
}

}  // namespace dpar::detail
