#pragma once
// Progress of long work (evaluation, checkpoint writing), the way users know it from tqdm:
//   eval: 45% (2304/5000 images), 812.3 images/s, ETA 3.3 s
// On a terminal the line is rewritten in place (at most every 0.1 s) and ends with a newline
// when the work is done. Into a file or pipe (a launcher's log) it prints plain lines instead:
// one every `plain_interval_s` while the work lasts, and a closing line only if any was
// printed, so short work leaves the log as it was.
//   Progress p("eval", total_images, "images");
//   for (...) p.advance(batch_size);
//   p.finish();
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

namespace dpar {

// done, total: for work that reports progress to its caller (checkpoint bytes written).
using ProgressCallback = std::function<void(int64_t done, int64_t total)>;

struct ProgressOptions {
  std::FILE* out = stdout;
  std::optional<bool> terminal;  // default: whether `out` is a terminal
  double terminal_interval_s = 0.1;
  double plain_interval_s = 5.0;
  std::function<double()> clock;  // seconds, monotonic; default steady_clock (tests inject)
};

class Progress {
 public:
  Progress(std::string label, double total, std::string unit, ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(double amount) { update(done_ + amount); }
  void update(double done);  // absolute amount done, 0..total
  void finish();             // idempotent; the destructor calls it

  // "eval: 45% (2304/5000 images), 812.3 images/s, ETA 3.3 s" for the current state.
  std::string line() const;
  int lines_printed() const { return lines_printed_; }

 private:
  double now() const;
  void print(bool final);

  std::string label_, unit_;
  double total_, done_ = 0;
  ProgressOptions options_;
  bool terminal_;
  double start_, last_print_;
  bool finished_ = false;
  int lines_printed_ = 0;
};

}  // namespace dpar
