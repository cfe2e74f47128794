#pragma once
// The benchmark report of the infer program, laid out like PaddlePaddle's AutoLog so tools
// that read those logs (section titles, "key: value" lines, the Perf info keys) read ours.
#include <cstdint>
#include <string>
#include <vector>

struct ReportFacts {
  std::string model_name;
  std::string precision;
  int threads = 1;
  int64_t batch_size = 1;
  std::vector<int64_t> input_shape;  // C, H, W
  int64_t images = 0;
  double total_s = 0;
  double preprocess_ms = 0;  // per image
  double inference_ms = 0;
  double postprocess_ms = 0;
  // GPU runs (--use-gpu=True): the device and the most device memory the allocator handed
  // out; empty device: the CPU.
  std::string gpu_device;
  double gpu_peak_mb = 0;
};

std::string benchmark_report(const ReportFacts& facts);

// A probability as the image lines print it (6 decimals).
std::string format_prob(double p);
