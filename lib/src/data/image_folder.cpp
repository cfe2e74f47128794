// ImageFolder: the ImageNet directory layout, scanned once at construction.
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "dpar/data/dataset.h"

namespace dpar::data {
namespace {

bool is_image_file(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

bool hidden(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

}  // namespace

ImageFolder::ImageFolder(const std::string& dir, Compose transform)
    : dir_(dir), transform_(std::move(transform)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DPAR_CHECK(fs::is_directory(dir, ec), "ImageFolder: '", dir,
             "' does not exist or is not a directory");
  std::vector<fs::path> class_dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && !hidden(e.path())) class_dirs.push_back(e.path());
  }
  DPAR_CHECK(!class_dirs.empty(), "ImageFolder: '", dir,
             "' has no class folders (expected <dir>/<class>/<image>.jpg)");
  std::sort(class_dirs.begin(), class_dirs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  for (const fs::path& cls : class_dirs) {
    const int64_t label = static_cast<int64_t>(classes_.size());
    classes_.push_back(cls.filename().string());
    std::vector<std::string> files;
    for (const fs::directory_entry& e : fs::directory_iterator(cls)) {
      if (e.is_regular_file() && !hidden(e.path()) && is_image_file(e.path())) {
        files.push_back(e.path().string());
      }
    }
    DPAR_CHECK(!files.empty(), "ImageFolder: class folder '", cls.string(),
               "' has no .jpg/.jpeg/.png images");
    std::sort(files.begin(), files.end());
    for (std::string& f : files) samples_.emplace_back(std::move(f), label);
  }
}

const std::string& ImageFolder::path(size_t index) const {
  DPAR_CHECK(index < size(), "ImageFolder: index ", index, " out of range for ", size(),
             " images in '", dir_, "'");
  return samples_[index].first;
}

int64_t ImageFolder::label(size_t index) const {
  DPAR_CHECK(index < size(), "ImageFolder: index ", index, " out of range for ", size(),
             " images in '", dir_, "'");
  return samples_[index].second;
}

Example ImageFolder::get(size_t index, Generator& rng) const {
  const std::string& file = path(index);
  return {transform_(read_image(file), rng), samples_[index].second};
}

}  // namespace dpar::data
