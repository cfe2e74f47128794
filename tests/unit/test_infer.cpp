// dpar::infer::Model::load on files that are not ONNX models at all; the model-level checks
// (parity with PyTorch, unsupported ops, truncation) are in tests/parity/test_infer_parity.cpp.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "dpar/infer/runtime.h"

namespace {

using dpar::infer::Model;
namespace fs = std::filesystem;

std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const dpar::Error& e) {
    return e.what();
  }
  return "";
}

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path =
      (fs::temp_directory_path() / ("dpar_test_infer_" + std::to_string(getpid()) + "_" + name))
          .string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST_CASE("loading something that is not an ONNX model names the file and the problem") {
  CHECK(load_error("/nonexistent/model.onnx").rfind("/nonexistent/model.onnx: no such file", 0) ==
        0);
  const std::string dir = fs::temp_directory_path().string();
  CHECK(load_error(dir).rfind(dir + ": is a directory", 0) == 0);

  const std::string empty = temp_file("empty.onnx", "");
  CHECK(load_error(empty).rfind(empty + ": empty file", 0) == 0);
  const std::string text = temp_file("text.onnx", "name,value\nlr,0.1\n");
  CHECK(load_error(text).rfind(text + ": not ", 0) == 0);
  // A protobuf that parses (one unknown varint field) but holds no model.
  const std::string stray = temp_file("stray.onnx", std::string("\xa0\x06\x01", 3));
  CHECK(load_error(stray).rfind(stray + ": not an ONNX model", 0) == 0);
  for (const auto& p : {empty, text, stray}) fs::remove(p);
}

}  // namespace
