// Top-1 of exported ONNX models on the Fashion-MNIST test split with dpar::infer, for the int8
// accuracy test (int8_accuracy.sh). Each model's own metadata gives the preprocessing (resize,
// centre crop, mean/std), as infer does.
//   eval_onnx [--threads 1] [--limit 0] [--dump x.safetensors --dump-count 256] a.onnx b.onnx
// prints "<path>: precision P, top-1 T % on N images" per model and, for two models, how
// often their top-1 classes agree. --dump writes the first --dump-count preprocessed images
// of the first model (x) and their labels.
#include <algorithm>
#include <cstdio>

#include "dpar/data/dataset.h"
#include "dpar/data/transforms.h"
#include "dpar/dpar.h"
#include "dpar/infer/runtime.h"
#include "dpar/io/safetensors.h"

using namespace dpar;

int main(int argc, char** argv) {
  return run_main("eval_onnx", [&] {
    Flags flags("eval_onnx", "Top-1 of ONNX models on the Fashion-MNIST test split");
    auto& threads = flags.add_int("threads", 1, "intra-op threads");
    auto& limit = flags.add_int("limit", 0, "first N test images (0: all 10000)");
    auto& dump = flags.add_string("dump", "", "write preprocessed images and labels here");
    auto& dump_count = flags.add_int("dump-count", 256, "images to --dump");
    const std::vector<std::string> models = flags.parse(argc, argv, /*allow_positional=*/true);
    if (models.empty()) throw FlagError("eval_onnx: name at least one .onnx file");
    std::vector<std::vector<int64_t>> predictions;
    std::vector<int64_t> labels;
    for (const std::string& path : models) {
      infer::Model model = infer::Model::load(path);
      model.set_num_threads(static_cast<int>(threads));
      const infer::ModelInfo& info = model.info();
      const int64_t side = info.input_height;
      const data::Compose tf({std::make_shared<data::Resize>(info.resize_size),
                              std::make_shared<data::CenterCrop>(side)},
                             data::ToTensorNormalize(info.mean, info.std));
      const data::FashionMnist test(data::FashionMnist::kDebianDir, data::Split::Test, tf,
                                    static_cast<size_t>(limit));
      Generator rng(0);
      std::vector<int64_t> pred;
      labels.clear();
      int64_t correct = 0;
      const int64_t n = static_cast<int64_t>(test.size()), per = 3 * side * side, batch = 100;
      Tensor dumped;
      for (int64_t first = 0; first < n; first += batch) {
        const int64_t count = std::min(batch, n - first);
        Tensor x = Tensor::empty({count, 3, side, side});
        for (int64_t i = 0; i < count; ++i) {
          const data::Example e = test.get(static_cast<size_t>(first + i), rng);
          std::copy_n(e.image.data<float>(), per, x.data<float>() + i * per);
          labels.push_back(e.label);
        }
        if (!dumped.defined()) dumped = Tensor::empty({std::min(n, dump_count), 3, side, side});
        for (int64_t i = 0; i < count && first + i < dumped.size(0); ++i) {
          std::copy_n(x.data<float>() + i * per, per, dumped.data<float>() + (first + i) * per);
        }
        const Tensor y = model.run(x);
        const int64_t classes = y.size(1);
        for (int64_t i = 0; i < count; ++i) {
          const float* row = y.data<float>() + i * classes;
          const int64_t top = std::max_element(row, row + classes) - row;
          pred.push_back(top);
          correct += top == labels[static_cast<size_t>(first + i)];
        }
      }
      std::printf(
          "%s: precision %s, top-1 %.2f %% on %lld images\n", path.c_str(), info.precision.c_str(),
          100.0 * static_cast<double>(correct) / static_cast<double>(n), static_cast<long long>(n));
      if (!dump.empty() && predictions.empty()) {
        std::vector<int64_t> l(labels.begin(), labels.begin() + dumped.size(0));
        io::save_safetensors(dump,
                             {{"x", dumped}, {"labels", Tensor::from_vector(l, {dumped.size(0)})}});
      }
      predictions.push_back(std::move(pred));
    }
    if (predictions.size() == 2) {
      int64_t same = 0;
      for (size_t i = 0; i < predictions[0].size(); ++i)
        same += predictions[0][i] == predictions[1][i];
      std::printf("top-1 agreement: %.2f %%\n",
                  100.0 * static_cast<double>(same) / static_cast<double>(predictions[0].size()));
    }
    return 0;
  });
}
