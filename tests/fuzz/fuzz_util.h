#pragma once
// Shared by the libFuzzer targets in this folder.
//
// What counts as a finding: a crash, a sanitizer report, a leak, a hang, memory beyond the
// limit scripts/fuzz.sh sets, or any exception other than dpar::Error escaping the library.
// Malformed input must end in a dpar::Error naming the input and the problem, so that is the
// one exception a target swallows.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "dpar/core/error.h"

namespace dpar::fuzz {

// A private folder on tmpfs (when /dev/shm exists) for inputs the library reads by path, as
// users hand it files. Removed at exit.
//
// The path is never destroyed: a function-local static's destructor is registered after its
// initializer returns, so it would run before an atexit handler registered inside that
// initializer, and the handler would remove a destroyed (empty) path, leaving the folder behind.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path* const dir = [] {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm")
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    auto* d = new std::filesystem::path(base / ("dpar-fuzz-" + std::to_string(::getpid())));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

// Writes bytes to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const auto path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path.string();
}

// Runs body; a dpar::Error is the expected answer to bad input, anything else escaping is a
// finding and aborts with its type and message so libFuzzer saves the input.
template <class Body>
void expect_only_dpar_errors(const char* target, Body&& body) {
  try {
    body();
  } catch (const dpar::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s escaped instead of dpar::Error: %s\n", target, typeid(e).name(),
                 e.what());
    std::abort();
  }
}

// Keeps a value alive so the compiler cannot drop the reads that computed it.
template <class T>
void keep(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

// Splits an input into the two parts a two-file format needs: a 2-byte little-endian length of
// the first part (clamped to what is there), the first part, then the rest.
inline std::pair<std::string_view, std::string_view> split_two(const uint8_t* data, size_t size) {
  if (size < 2) return {};
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  const size_t first = std::min<size_t>(data[0] | (size_t{data[1]} << 8), rest.size());
  return {rest.substr(0, first), rest.substr(first)};
}

}  // namespace dpar::fuzz
