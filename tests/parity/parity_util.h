#pragma once
// Shared by the parity tests: reading the fixtures that tests/parity/fixtures_*.py write into
// $DPAR_PARITY_DIR, the relative-error measure the tolerances refer to, and a table of the
// worst errors that each test prints so reports can quote them.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dpar/dpar.h"
#include "dpar/io/safetensors.h"

namespace dpar::parity {

inline std::string fixture_dir() {
  const char* dir = std::getenv("DPAR_PARITY_DIR");
  if (dir == nullptr || *dir == '\0') {
    FAIL(
        "DPAR_PARITY_DIR is not set: run through ctest (the fixture scripts are a setup step) "
        "or write fixtures by hand, see tests/parity/README.md");
  }
  return dir;
}

// One fixture file, by tensor name.
class Fixture {
 public:
  explicit Fixture(const std::string& file) : path_(fixture_dir() + "/" + file) {
    io::SafetensorsContents contents = io::load_safetensors(path_);
    entries_ = std::move(contents.tensors);
    for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].first] = i;
  }

  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const Tensor& operator[](const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end()) FAIL(path_ << " has no tensor named '" << name << "'");
    return entries_[it->second].second;
  }
  const io::NamedTensors& entries() const { return entries_; }
  const std::string& path() const { return path_; }

  // Scalar configuration values (cfg.* tensors of one or a few elements).
  int64_t int_at(const std::string& name, size_t i = 0) const {
    return (*this)[name].to_int_vector().at(i);
  }
  double float_at(const std::string& name) const { return (*this)[name].to_float_vector().at(0); }

 private:
  std::string path_;
  io::NamedTensors entries_;
  std::map<std::string, size_t> index_;
};

// The message of the dpar::Error that fn throws ("" if it throws none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_float_vector()) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

// max|ours - ref| / max(max|ref|, 1e-6) over the whole tensor: the error relative to the
// tensor's scale, so elements near zero do not dominate. Non-finite values give +inf.
inline double rel_error(const Tensor& ours, const Tensor& ref) {
  const std::vector<float> a = ours.to_float_vector();
  const std::vector<float> b = ref.to_float_vector();
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-6);
}

// The worst relative error seen per group, with the tensor that produced it.
class ErrorTable {
 public:
  void add(const std::string& group, const std::string& what, double err) {
    auto [it, inserted] = worst_.try_emplace(group, err, what);
    if (!inserted && !(err <= it->second.first)) it->second = {err, what};
  }
  double worst(const std::string& group) const {
    auto it = worst_.find(group);
    return it == worst_.end() ? 0.0 : it->second.first;
  }
  void print(const std::string& title) const {
    std::printf("%s: worst relative error per group\n", title.c_str());
    for (const auto& [group, entry] : worst_) {
      std::printf("  %-34s %.3e  (%s)\n", group.c_str(), entry.first, entry.second.c_str());
    }
    std::fflush(stdout);
  }

 private:
  std::map<std::string, std::pair<double, std::string>> worst_;
};

// Checks one tensor against its reference: same shape, relative error within tol. Records
// the error in table under group.
inline double check_close(const Tensor& ours, const Tensor& ref, double tol,
                          const std::string& what, ErrorTable& table, const std::string& group) {
  INFO(what << ": ours " << (ours.defined() ? ours.str() : "undefined") << ", torch " << ref.str());
  REQUIRE(ours.defined());
  CHECK(ours.shape() == ref.shape());
  const double err = rel_error(ours, ref);
  table.add(group, what, err);
  INFO(what << ": relative error " << err << " (tolerance " << tol << ")");
  CHECK(err <= tol);
  return err;
}

}  // namespace dpar::parity
