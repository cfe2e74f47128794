// Writes the lite data set of the test chain from Fashion-MNIST's idx files: a few classes with
// N training and N validation images each as JPEG files in the ImageNet folder layout, the
// validation images once more in one flat folder (for the inference program, which reads a
// file or a folder), and demo.jpg, a test image that is in neither split:
//   <output>/train/<class>/<class>_<index>.jpg   (from the training split)
//   <output>/val/<class>/<class>_<index>.jpg     (from the test split)
//   <output>/infer/<class>_<index>.jpg           (the val images, flat)
//   <output>/demo.jpg
//   <output>/labels.txt                          (class folder names, in label order)
// <index> is the image's position in its idx split, so the files say where they came from.
// The output folder must not exist yet (prepare.sh writes to a temporary folder and renames
// it), so a rerun never mixes old and new files.
//   make_lite_data --output data/lite --classes 0,1,7,8 --per-class 4
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "dpar/core/flags.h"
#include "dpar/data/dataset.h"
#include "dpar/data/image.h"

using namespace dpar;
namespace fs = std::filesystem;

namespace {

// "T-shirt/top" -> "T-shirt_top", "Ankle boot" -> "Ankle_boot": folder and file names.
std::string folder_name(const std::string& class_name) {
  std::string out = class_name;
  for (char& c : out) {
    if (c == '/' || c == ' ' || c == '\\') c = '_';
  }
  return out;
}

std::vector<int64_t> parse_classes(const std::string& text, int64_t num_classes) {
  std::vector<int64_t> classes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t c = -1;
    try {
      c = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || c < 0 || c >= num_classes) {
      throw FlagError("make_lite_data: --classes=" + text + ": '" + item +
                      "' is not a class index in 0.." + std::to_string(num_classes - 1));
    }
    if (std::find(classes.begin(), classes.end(), c) != classes.end()) {
      throw FlagError("make_lite_data: --classes=" + text + ": class " + item + " is listed twice");
    }
    classes.push_back(c);
  }
  if (classes.empty()) throw FlagError("make_lite_data: --classes must name at least one class");
  return classes;
}

// The first `per_class` images of each wanted class, in idx order: class -> indices.
std::map<int64_t, std::vector<size_t>> pick(const data::FashionMnist& split,
                                            const std::vector<int64_t>& classes, size_t per_class,
                                            const char* split_name) {
  std::map<int64_t, std::vector<size_t>> picked;
  for (int64_t c : classes) picked[c];
  for (size_t i = 0; i < split.size(); ++i) {
    const int64_t c = split.label(i);
    auto it = picked.find(c);
    if (it == picked.end() || it->second.size() == per_class) continue;
    it->second.push_back(i);
  }
  for (const auto& [c, idx] : picked) {
    DPAR_CHECK(idx.size() == per_class, "the ", split_name, " split has only ", idx.size(),
               " images of class ", c, ", wanted ", per_class);
  }
  return picked;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("make_lite_data", [&] {
    Flags flags("make_lite_data",
                "Writes the test chain's lite data (JPEG, ImageNet folder layout) from "
                "Fashion-MNIST.");
    auto& source = flags.add_string("fashion-mnist", data::FashionMnist::kDebianDir,
                                    "folder with Fashion-MNIST's idx files (plain or .gz)");
    auto& output = flags.add_string("output", "", "folder to create (must not exist)");
    auto& class_list = flags.add_string("classes", "0,1,7,8", "class indices to include");
    auto& per_class = flags.add_int("per-class", 4, "train images and val images per class");
    auto& quality = flags.add_int("quality", 95, "JPEG quality (1..100)");
    flags.parse(argc, argv);

    if (output.empty()) throw FlagError("make_lite_data: --output is required");
    if (per_class < 1) throw FlagError("make_lite_data: --per-class must be >= 1");
    if (quality < 1 || quality > 100) throw FlagError("make_lite_data: --quality must be 1..100");
    std::error_code ec;
    DPAR_CHECK(fs::is_directory(source, ec), "--fashion-mnist ", source,
               " is not a folder (install Debian's dataset-fashion-mnist or pass the folder "
               "with the idx files)");
    DPAR_CHECK(!fs::exists(output, ec), "--output ", output,
               " already exists; remove it or choose another folder");

    const data::FashionMnist train(source, data::Split::Train);
    const data::FashionMnist test(source, data::Split::Test);
    const std::vector<std::string> names = train.class_names();
    const std::vector<int64_t> classes =
        parse_classes(class_list, static_cast<int64_t>(names.size()));
    const size_t n = static_cast<size_t>(per_class);
    const auto train_pick = pick(train, classes, n, "training");
    // One more test image of the first class than the val split uses: the demo image.
    const auto test_pick = pick(test, classes, n + 1, "test");

    const fs::path root(output);
    auto write = [&](const data::FashionMnist& split, size_t index, const fs::path& path) {
      fs::create_directories(path.parent_path());
      data::write_jpeg(path.string(), split.image(index), static_cast<int>(quality));
    };
    size_t written = 0;
    for (int64_t c : classes) {
      const std::string folder = folder_name(names[static_cast<size_t>(c)]);
      for (size_t i : train_pick.at(c)) {
        write(train, i, root / "train" / folder / (folder + "_" + std::to_string(i) + ".jpg"));
        ++written;
      }
      const std::vector<size_t>& val = test_pick.at(c);
      for (size_t k = 0; k < n; ++k) {
        const std::string file = folder + "_" + std::to_string(val[k]) + ".jpg";
        write(test, val[k], root / "val" / folder / file);
        write(test, val[k], root / "infer" / file);
        ++written;
      }
    }
    write(test, test_pick.at(classes.front()).back(), root / "demo.jpg");

    // Label order is the sorted folder order (ImageFolder's rule), not the --classes order.
    std::vector<std::string> folders;
    for (int64_t c : classes) folders.push_back(folder_name(names[static_cast<size_t>(c)]));
    std::sort(folders.begin(), folders.end());
    FILE* f = std::fopen((root / "labels.txt").c_str(), "w");
    DPAR_CHECK(f != nullptr, "cannot write ", (root / "labels.txt").string());
    for (const std::string& name : folders) std::fprintf(f, "%s\n", name.c_str());
    DPAR_CHECK(std::fclose(f) == 0, "cannot write ", (root / "labels.txt").string());

    std::printf(
        "make_lite_data: wrote %zu train/val images of %zu classes, infer/ and demo.jpg to %s\n",
        written, classes.size(), output.c_str());
    return 0;
  });
}
