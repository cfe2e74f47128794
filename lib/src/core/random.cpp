#include "dpar/core/random.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "dpar/core/error.h"

namespace dpar {

Generator::Generator(const Generator& other) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  engine_ = other.engine_;
  has_spare_ = other.has_spare_;
  spare_ = other.spare_;
}

Generator& Generator::operator=(const Generator& other) {
  if (this == &other) return *this;
  std::scoped_lock lock(mutex_, other.mutex_);
  engine_ = other.engine_;
  has_spare_ = other.has_spare_;
  spare_ = other.spare_;
  return *this;
}

float Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box-Muller on doubles built from 53 random bits: same numbers on every platform.
  const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0);
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.283185307179586 * u2;
  spare_ = static_cast<float>(r * std::sin(theta));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(theta));
}

std::string Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream os;
  os << engine_ << ' ' << has_spare_ << ' ' << std::hexfloat << spare_;
  return os.str();
}

void Generator::set_state(const std::string& s) {
  std::istringstream is(s);
  // libstdc++'s operator>> cannot read hex floats (it stops at the 'x' and reports success),
  // so the spare normal is read as a token and parsed with strtof, which can.
  std::mt19937_64 engine;
  bool has_spare = false;
  std::string spare_text;
  is >> engine >> has_spare >> spare_text;
  DPAR_CHECK(!is.fail(), "Generator::set_state: malformed generator state");
  char* end = nullptr;
  const float spare = std::strtof(spare_text.c_str(), &end);
  DPAR_CHECK(end != spare_text.c_str() && *end == '\0',
             "Generator::set_state: malformed spare value '", spare_text, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  engine_ = engine;
  has_spare_ = has_spare;
  spare_ = spare;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator() = Generator(seed); }

}  // namespace dpar
