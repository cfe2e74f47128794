// Eval-mode forward latency of MobileNetV3-small (224x224) in the same invocation:
//   dpar eager        the nn::Module forward (autograd-capable ops, no fusion)
//   dpar::infer       the same weights exported to ONNX (io::export_onnx: BN folded) and run by
//                     the inference runtime (fused oneDNN primitives, planned buffers)
//   onnxruntime       the same ONNX file on onnxruntime's CPU provider (bench/peers/ort_infer.js,
//                     onnxruntime-node: all graph optimisations, sequential execution, the same
//                     intra-op threads); its output is compared with dpar::infer's before timing
//                     (fp32: within 1e-4, or the benchmark stops)
//   PyTorch eager / TorchScript frozen + optimize_for_inference (bench/peers/torch_infer.py)
// Figures are medians of per-run times; ratios are dpar::infer over onnxruntime (issue 23's
// targets: <= 0.7x at batch 1, <= 0.8x at batch 32) and over TorchScript frozen.
//
// --precision int8 adds the same model quantized by io::quantize_qdq (calibrated on a few
// random batches: the speed does not depend on the ranges) and run by dpar::infer's int8
// path, onnxruntime on the same QDQ file, and PyTorch's torch.ao.quantization FX int8 (fbgemm)
// in the peer, and prints dpar int8 / dpar fp32 (target <= 0.6 at batch 32), dpar int8 /
// onnxruntime int8 (target < 1) and whether the CPU has VNNI (oneDNN uses it when present and
// its AVX2 / AVX-512 int8 kernels otherwise).
//
// --profile prints, after each batch's timings, dpar eager's per-op profile and, per kind of
// node (1x1, depthwise and other convolutions, reorders, pooling, ...), dpar::infer's time per
// run beside onnxruntime's on the same file (its own profiler), in runs apart from the timed
// ones: both profilers wait at every node.
//
// --rounds N (with onnxruntime) times dpar::infer and a fresh onnxruntime process N times in
// turn and prints the median of the per-round ratios: on a shared machine the speed drifts
// within seconds, and one pair of timings can land on either side of a target.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "bench_util.h"
#include "dpar/dpar.h"
#include "dpar/infer/runtime.h"
#include "dpar/io/onnx_quantize.h"
#include "model/mobilenet_v3.h"
#include "model/mobilenet_v3_onnx.h"

using namespace dpar;

namespace {

// Median of per-run times in ms, as the peer measures: robust to other processes taking the
// core for a moment, which a mean over a few runs is not.
template <class Fn>
double time_ms(Fn&& fn, int64_t warmup, int64_t iters) {
  for (int64_t i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int64_t i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(bench::seconds_since(t0) * 1e3);
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<int64_t>(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

// "0.71x (0.65-0.80)": the median of per-round ratios and their range.
std::string median_and_range(const std::vector<double>& ratios) {
  const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
  char text[64];
  std::snprintf(text, sizeof text, "%.2fx (%.2f-%.2f)", bench::median(ratios), *low, *high);
  return text;
}

// "avx512_vnni", "avx_vnni", both, or "none", from the kernel's CPU flags.
std::string vnni_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, found;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    for (const char* f : {"avx512_vnni", "avx_vnni"}) {
      if ((" " + line + " ").find(std::string(" ") + f + " ") != std::string::npos) {
        found += (found.empty() ? "" : ", ") + std::string(f);
      }
    }
    break;
  }
  return found.empty() ? "none" : found;
}

// Where scripts/bootstrap.sh installs onnxruntime-node: $DPAR_ORT_NODE_DIR, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/dpar/onnxruntime-node. Empty, with `why` set, when it or
// node is missing.
std::string onnxruntime_node_dir(std::string& why) {
  std::string dir;
  if (const char* d = std::getenv("DPAR_ORT_NODE_DIR"); d && *d) {
    dir = d;
  } else if (const char* c = std::getenv("XDG_CACHE_HOME"); c && *c) {
    dir = std::string(c) + "/dpar/onnxruntime-node";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = std::string(h) + "/.cache/dpar/onnxruntime-node";
  }
  if (dir.empty() ||
      !std::filesystem::exists(dir + "/node_modules/onnxruntime-node/package.json")) {
    why = "onnxruntime-node is not installed in '" + dir + "' (scripts/bootstrap.sh installs it)";
    return "";
  }
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    why = "node is not on PATH (scripts/bootstrap.sh installs Debian's nodejs)";
    return "";
  }
  return dir;
}

// dpar::infer's time per run by kind of step (Plan::run's DPAR_PROFILE records), beside
// onnxruntime's profile of the same file ({kind: ms per run}, from ort_infer.js) when given.
void print_infer_profile(const std::string& label, infer::Model& model, const Tensor& x,
                         int64_t runs, const nlohmann::json* ort_profile) {
  profiler::reset();
  profiler::set_enabled(true);
  for (int64_t i = 0; i < runs; ++i) model.run(x);
  profiler::set_enabled(false);
  std::vector<std::pair<std::string, double>> kinds;  // largest dpar time first
  const std::string prefix = "infer ";
  for (const profiler::Row& r : profiler::rows()) {
    if (r.name.rfind(prefix, 0) != 0) continue;
    kinds.emplace_back(r.name.substr(prefix.size()),
                       static_cast<double>(r.nanoseconds) / 1e6 / static_cast<double>(runs));
  }
  if (ort_profile) {  // kinds only onnxruntime has, after dpar's
    for (const auto& [kind, ms] : ort_profile->items()) {
      if (std::none_of(kinds.begin(), kinds.end(),
                       [&](const auto& k) { return k.first == kind; })) {
        kinds.emplace_back(kind, 0.0);
      }
    }
  }
  std::printf("  %s profile, batch %lld, ms per run (mean of %lld profiled runs):\n", label.c_str(),
              static_cast<long long>(x.shape()[0]), static_cast<long long>(runs));
  std::printf("    %-30s %10s%s\n", "kind", "dpar", ort_profile ? "  onnxruntime" : "");
  double ours_total = 0, ort_total = 0;
  for (const auto& [kind, ms] : kinds) {
    ours_total += ms;
    std::printf("    %-30s %10.3f", kind.c_str(), ms);
    if (ort_profile) {
      const double theirs = ort_profile->contains(kind) ? ort_profile->at(kind).get<double>() : 0;
      ort_total += theirs;
      std::printf("  %11.3f", theirs);
    }
    std::printf("\n");
  }
  std::printf("    %-30s %10.3f", "total", ours_total);
  if (ort_profile) std::printf("  %11.3f", ort_total);
  std::printf("\n");
}

// Raw little-endian f32 in logical order, as the onnxruntime peer reads its input.
void write_floats(const std::filesystem::path& file, const Tensor& t) {
  const std::vector<float> v = t.to_float_vector();
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  DPAR_CHECK(out.good(), "bench_infer: cannot write ", file.string());
}

Tensor random_batch(Generator& gen, int64_t b, int64_t img) {
  std::vector<float> xv(static_cast<size_t>(b * 3 * img * img));
  for (float& v : xv) v = gen.normal();
  return Tensor::from_vector(xv, {b, 3, img, img});
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_infer", [&] {
    Flags flags("bench_infer", "MobileNetV3-small eval forward: dpar eager, dpar::infer, PyTorch");
    auto& batches = flags.add_string("batch", "1,32", "comma-separated batch sizes");
    auto& threads = flags.add_int("threads", 1, "intra-op threads (both frameworks)");
    auto& img = flags.add_int("img", 224, "image side");
    auto& warmup = flags.add_int("warmup", 3, "untimed runs");
    auto& iters = flags.add_int("iters", 20, "timed runs");
    auto& rounds =
        flags.add_int("rounds", 1, "alternating dpar::infer / onnxruntime rounds (median ratio)");
    auto& eager = flags.add_bool("eager", true, "time dpar's eager nn::Module forward");
    auto& onnx = flags.add_bool("onnx", true, "time dpar::infer on the exported ONNX model");
    auto& peer = flags.add_bool("peer", true, "also run the PyTorch peer");
    auto& ort = flags.add_bool("ort", true, "also run onnxruntime (onnxruntime-node) on the file");
    auto& profile = flags.add_bool(
        "profile", false,
        "print dpar eager's per-op profile, and dpar::infer's beside onnxruntime's by node kind");
    auto& plan = flags.add_bool("plan", false, "print dpar::infer's execution plan");
    auto& precision =
        flags.add_string("precision", "fp32", "fp32, or int8: also time the int8 (QDQ) model");
    flags.parse(argc, argv);
    if (precision != "fp32" && precision != "int8") {
      throw FlagError("bench_infer: --precision=" + precision + ": expected fp32 or int8");
    }
    const bool int8 = precision == "int8";
    if (rounds < 1) throw FlagError("bench_infer: --rounds must be at least 1");
    if (rounds > 1 && !(onnx && ort)) {
      throw FlagError(
          "bench_infer: --rounds alternates dpar::infer with onnxruntime; drop "
          "--onnx=false / --ort=false");
    }
    if (int8 && !onnx) throw FlagError("bench_infer: --precision int8 needs --onnx");

    set_num_threads(static_cast<int>(threads));
    manual_seed(0);
    auto model = models::mobilenet_v3_small(1000);
    model->eval();
    NoGradGuard no_grad;
    std::optional<infer::Model> runtime, runtime_int8;
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("dpar_bench_infer_" + std::to_string(getpid()));
    // The exported files stay until the end: the onnxruntime peer runs them.
    struct RemoveAtExit {
      std::filesystem::path dir;
      ~RemoveAtExit() { std::filesystem::remove_all(dir); }
    } remove_at_exit{dir};
    std::string fp32_path, int8_path;
    if (onnx) {
      io::OnnxExportOptions options;
      options.model_name = "mobilenet_v3_small";
      options.height = options.width = img;
      options.softmax = false;  // logits, as the peers return
      options.write_json = false;
      const auto exported = models::export_mobilenet_v3(*model, dir.string(), options);
      fp32_path = exported.model_path;
      runtime = infer::Model::load(exported.model_path);
      runtime->set_num_threads(static_cast<int>(threads));
      if (int8) {
        options.graph_pass = [&](io::OnnxGraph& g) {
          io::OnnxCalibrator calib(g);
          Generator gen(2);
          for (int i = 0; i < 2; ++i) calib.observe(random_batch(gen, 4, img));
          io::quantize_qdq(g, calib);
        };
        const auto q = models::export_mobilenet_v3(*model, (dir / "int8").string(), options);
        int8_path = q.model_path;
        runtime_int8 = infer::Model::load(q.model_path);
        runtime_int8->set_num_threads(static_cast<int>(threads));
      }
    }
    std::string ort_dir, ort_missing;
    if (ort && onnx) ort_dir = onnxruntime_node_dir(ort_missing);
    std::printf("bench_infer: mobilenet_v3_small %lldpx eval forward, %lld thread(s), oneDNN %s\n",
                static_cast<long long>(img), static_cast<long long>(threads),
                infer::onednn_version().c_str());
    if (int8) {
      const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
      const std::string capped =
          cap ? std::string(" (oneDNN capped: ONEDNN_MAX_CPU_ISA=") + cap + ")" : "";
      std::printf("  CPU VNNI: %s%s\n", vnni_flags().c_str(), capped.c_str());
    }
    if (ort && onnx && ort_dir.empty()) {
      std::printf("  onnxruntime peer skipped: %s\n", ort_missing.c_str());
    }
    size_t pos = 0;
    while (pos <= batches.size()) {
      const size_t comma = batches.find(',', pos);
      const int64_t b = std::stoll(batches.substr(pos, comma - pos));
      pos = comma == std::string::npos ? batches.size() + 1 : comma + 1;
      Generator gen(1);
      const Tensor x = random_batch(gen, b, img);
      std::printf("  batch %3lld:", static_cast<long long>(b));
      if (eager) {
        const double ms = time_ms([&] { model->forward(x); }, warmup, iters);
        std::printf(" dpar eager %8.2f ms |", ms);
      }
      double infer_ms = 0;
      if (runtime) {
        runtime->prepare(x.shape());
        infer_ms = time_ms([&] { runtime->run(x); }, warmup, iters);
        std::printf(" dpar::infer %8.2f ms |", infer_ms);
      }
      std::optional<nlohmann::json> ort_profile, ort_int8_profile;
      std::string rounds_report;
      double int8_ms = 0, ort_int8_ms = 0;
      if (runtime_int8) {
        runtime_int8->prepare(x.shape());
        int8_ms = time_ms([&] { runtime_int8->run(x); }, warmup, iters);
        std::printf(" dpar::infer int8 %8.2f ms (int8 / fp32 %.2fx) |", int8_ms,
                    int8_ms / infer_ms);
      }
      if (!ort_dir.empty()) {
        // onnxruntime on the same file and input, its output checked against dpar::infer's.
        const std::string tag = std::to_string(b);
        write_floats(dir / ("input_" + tag + ".bin"), x);
        auto run_ort = [&](const std::string& model_path, infer::Model& ours,
                           const std::string& name, bool with_profile) {
          // dpar::infer's output for this input, written once (--rounds runs the peer again).
          const std::filesystem::path expected = dir / (name + "_expected_" + tag + ".bin");
          if (!std::filesystem::exists(expected)) write_floats(expected, ours.run(x));
          return bench::run_peer_program(
              "node", "ort_infer.js",
              "--model " + model_path + " --input " + (dir / ("input_" + tag + ".bin")).string() +
                  " --shape " + tag + ",3," + std::to_string(img) + "," + std::to_string(img) +
                  " --expected " + expected.string() + " --threads " + std::to_string(threads) +
                  " --warmup " + std::to_string(warmup) + " --iters " + std::to_string(iters) +
                  " --ort-dir " + ort_dir +
                  (with_profile ? " --profile-prefix " + (dir / ("ort_profile_" + name)).string()
                                : ""),
              static_cast<int>(threads));
        };
        const auto o = run_ort(fp32_path, *runtime, "fp32", profile);
        if (o.contains("profile")) ort_profile = o.at("profile");
        const double ort_ms = o.at("ms").get<double>();
        const double diff = o.at("max_abs_diff").get<double>();
        // Relative to the largest logit: a randomly initialised MobileNetV3 in eval mode gives
        // logits near 1e-9 (torchvision's too), where any absolute bound would pass anything.
        const double scale = o.at("max_abs_expected").get<double>();
        const double limit = 1e-4 * scale;
        DPAR_CHECK(diff <= limit,
                   "bench_infer: onnxruntime's output differs from dpar::infer's "
                   "by ",
                   diff, " at batch ", b, " (limit ", limit, "): not the same computation");
        std::printf(
            " onnxruntime %s %8.2f ms (max diff %.1e of %.1e) | dpar::infer / "
            "onnxruntime %.2fx |",
            o.at("ort").get<std::string>().c_str(), ort_ms, diff, scale, infer_ms / ort_ms);
        if (runtime_int8) {
          const auto q = run_ort(int8_path, *runtime_int8, "int8", profile);
          if (q.contains("profile")) ort_int8_profile = q.at("profile");
          ort_int8_ms = q.at("ms").get<double>();
          // int8 outputs differ by rounding at each requantisation: reported, not checked.
          std::printf(
              " onnxruntime int8 %8.2f ms (max diff %.1e of %.1e) | dpar int8 / "
              "onnxruntime int8 %.2fx |",
              ort_int8_ms, q.at("max_abs_diff").get<double>(),
              q.at("max_abs_expected").get<double>(), int8_ms / ort_int8_ms);
        }
        if (rounds > 1) {
          std::vector<double> ratios{infer_ms / ort_ms}, int8_ratios;
          if (runtime_int8) int8_ratios.push_back(int8_ms / ort_int8_ms);
          for (int64_t r = 2; r <= rounds; ++r) {
            const double mine = time_ms([&] { runtime->run(x); }, warmup, iters);
            const double theirs =
                run_ort(fp32_path, *runtime, "fp32", false).at("ms").get<double>();
            ratios.push_back(mine / theirs);
            char line[192];
            std::snprintf(line, sizeof line,
                          "    round %lld: dpar::infer %.2f ms, onnxruntime %.2f ms, %.2fx",
                          static_cast<long long>(r), mine, theirs, mine / theirs);
            rounds_report += line;
            if (runtime_int8) {
              const double mine_int8 = time_ms([&] { runtime_int8->run(x); }, warmup, iters);
              const double theirs_int8 =
                  run_ort(int8_path, *runtime_int8, "int8", false).at("ms").get<double>();
              int8_ratios.push_back(mine_int8 / theirs_int8);
              std::snprintf(line, sizeof line, "; int8 %.2f ms, %.2f ms, %.2fx", mine_int8,
                            theirs_int8, mine_int8 / theirs_int8);
              rounds_report += line;
            }
            rounds_report += "\n";
          }
          rounds_report += "    median dpar::infer / onnxruntime over " + std::to_string(rounds) +
                           " rounds: fp32 " + median_and_range(ratios);
          if (runtime_int8) rounds_report += ", int8 " + median_and_range(int8_ratios);
          rounds_report += "\n";
        }
      }
      if (peer) {
        const auto p = bench::run_peer(
            "torch_infer.py",
            "--batch " + std::to_string(b) + " --threads " + std::to_string(threads) + " --img " +
                std::to_string(img) + " --warmup " + std::to_string(warmup) + " --iters " +
                std::to_string(iters) + (int8 ? " --int8" : ""),
            static_cast<int>(threads));
        const double peer_eager = p.at("eager_ms").get<double>();
        const double frozen = p.at("frozen_ms").get<double>();
        std::printf(" pytorch eager %8.2f ms | torchscript frozen %8.2f ms", peer_eager, frozen);
        if (runtime) std::printf(" | dpar::infer / frozen %.2fx", infer_ms / frozen);
        if (int8 && p.contains("int8_ms")) {
          const double torch_int8 = p.at("int8_ms").get<double>();
          std::printf(" | pytorch fx int8 (%s) %8.2f ms | dpar int8 / pytorch int8 %.2fx",
                      p.at("int8_engine").get<std::string>().c_str(), torch_int8,
                      int8_ms / torch_int8);
        }
        if (int8 && p.contains("int8_error")) {
          std::printf(" | pytorch fx int8 failed: %s",
                      p.at("int8_error").get<std::string>().c_str());
        }
      }
      std::printf("\n%s", rounds_report.c_str());
      std::fflush(stdout);
      if (plan && runtime) {
        for (const std::string& line : runtime->plan_summary(x.shape())) {
          std::printf("    %s\n", line.c_str());
        }
      }
      if (plan && runtime_int8) {
        std::printf("  int8 plan:\n");
        for (const std::string& line : runtime_int8->plan_summary(x.shape())) {
          std::printf("    %s\n", line.c_str());
        }
      }
      if (profile && eager) {
        profiler::reset();
        profiler::set_enabled(true);
        for (int64_t i = 0; i < iters; ++i) model->forward(x);
        profiler::set_enabled(false);
        std::printf("per-op profile (batch %lld, %lld runs):\n%s", static_cast<long long>(b),
                    static_cast<long long>(iters), profiler::report().c_str());
      }
      if (profile && runtime) {
        print_infer_profile("dpar::infer fp32", *runtime, x, iters,
                            ort_profile ? &*ort_profile : nullptr);
      }
      if (profile && runtime_int8) {
        print_infer_profile("dpar::infer int8", *runtime_int8, x, iters,
                            ort_int8_profile ? &*ort_int8_profile : nullptr);
      }
    }
    return 0;
  });
}
