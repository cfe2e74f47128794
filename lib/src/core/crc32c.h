#pragma once
// CRC-32C (Castagnoli), computed by ISA-L's crc32_iscsi (SSE4.2 / AVX-512 folding): the checksum
// of TensorBoard event records, of parameter-server chunks and of every hop of the Gloo ring
// collectives. One implementation, so the three cannot drift apart.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dpar::detail {

// A running CRC-32C over several pieces; value() is the CRC of their concatenation.
class Crc32c {
 public:
  Crc32c& add(const void* data, size_t size);
  template <class T>
  Crc32c& add_value(T value) {
    static_assert(std::is_arithmetic_v<T>);
    return add(&value, sizeof value);
  }
  uint32_t value() const { return ~state_; }

 private:
  uint32_t state_ = 0xffffffffu;  // ISA-L works on the pre- and post-inverted register
};

inline uint32_t crc32c(const void* data, size_t size) { return Crc32c().add(data, size).value(); }

// "got != expected" in hex, as every CRC mismatch message quotes them.
std::string crc_pair(uint32_t got, uint32_t expected);

}  // namespace dpar::detail
