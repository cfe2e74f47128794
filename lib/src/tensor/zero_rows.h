#pragma once
// Exactly-zero rows of a gradient. A classifier that reads one token of a sequence model (ViT's
// class token) leaves every other row of its last layers' gradients exactly zero; the backward
// of a linear layer and of attention then computes with the nonzero rows only.
#include <bit>
#include <cstdint>

namespace dpar::detail {

// Whether n floats are all +0 or -0 (their magnitude bits zero), 16 at a time: each group is
// one vector OR, and a dense row stops at its first group.
inline bool row_is_zero(const float* row, int64_t n) {
  constexpr uint32_t kMagnitude = 0x7fffffffu;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    uint32_t bits = 0;
    for (int64_t l = 0; l < 16; ++l) bits |= std::bit_cast<uint32_t>(row[j + l]);
    if ((bits & kMagnitude) != 0) return false;
  }
  uint32_t bits = 0;
  for (; j < n; ++j) bits |= std::bit_cast<uint32_t>(row[j]);
  return (bits & kMagnitude) == 0;
}

}  // namespace dpar::detail
