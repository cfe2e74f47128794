#pragma once
// Exactly-zero rows of a gradient. A classifier that reads one token of a sequence model (ViT's
// class token) leaves every other row of its last layers' gradients exactly zero; the backward
// of a linear layer and of attention then computes with the nonzero rows only.
#include <bit>
#include <cstdint>
#include <vector>

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

// The rows of the m x n block at `data` (rows `ld` floats apart) that hold a nonzero element,
// into `rows` (cleared first); false as soon as they are more than half of m, where computing
// with them alone would save little and the caller runs the full products.
inline bool few_nonzero_rows(const float* data, int64_t m, int64_t n, int64_t ld,
                             std::vector<int64_t>& rows) {
  rows.clear();
  for (int64_t i = 0; i < m; ++i) {
    if (row_is_zero(data + i * ld, n)) continue;
    rows.push_back(i);
    if (2 * static_cast<int64_t>(rows.size()) > m) return false;
  }
  return true;
}

}  // namespace dpar::detail
