#include "dpar/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace dpar {
namespace {

std::string number(double v) {
  char text[32];
  // Whole counts as integers (images), fractional amounts (MB) with one decimal.
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(text, sizeof text, "%.0f", v);
  } else {
    std::snprintf(text, sizeof text, "%.1f", v);
  }
  return text;
}

}  // namespace

Progress::Progress(std::string label, double total, std::string unit, ProgressOptions options)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max(0.0, total)),
      options_(std::move(options)) {
  terminal_ =
      options_.terminal.value_or(options_.out != nullptr && ::isatty(::fileno(options_.out)));
  start_ = last_print_ = now();
}

Progress::~Progress() { finish(); }

double Progress::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Progress::line() const {
  const double elapsed = now() - start_;
  const double rate = elapsed > 0 ? done_ / elapsed : 0;
  // (100 * done) / total can round below 100 when done == total.
  const int percent =
      done_ >= total_ ? 100 : static_cast<int>(std::floor(100.0 * (done_ / total_)));
  char tail[96];
  if (done_ >= total_) {
    std::snprintf(tail, sizeof tail, "%.1f s", elapsed);
  } else if (rate > 0) {
    std::snprintf(tail, sizeof tail, "ETA %.1f s", (total_ - done_) / rate);
  } else {
    std::snprintf(tail, sizeof tail, "ETA ?");
  }
  char rate_text[48];
  std::snprintf(rate_text, sizeof rate_text, "%.1f", rate);
  return label_ + ": " + std::to_string(percent) + "% (" + number(done_) + "/" + number(total_) +
         " " + unit_ + "), " + rate_text + " " + unit_ + "/s, " + tail;
}

void Progress::update(double done) {
  if (finished_ || options_.out == nullptr) return;
  done_ = std::clamp(done, 0.0, total_);
  const double interval = terminal_ ? options_.terminal_interval_s : options_.plain_interval_s;
  if (done_ < total_ && now() - last_print_ >= interval) print(/*final=*/false);
}

void Progress::finish() {
  if (finished_ || options_.out == nullptr) return;
  finished_ = true;
  // The closing line: on a terminal always (it ends the rewritten line); in a log only when
  // progress lines were printed, which happens only for work that lasted.
  if (terminal_ || lines_printed_ > 0) print(/*final=*/true);
}

void Progress::print(bool final) {
  const std::string text = line();
  if (terminal_) {
    // \r returns to the line start, \x1b[K clears what a longer earlier line left behind.
    std::fprintf(options_.out, "\r%s\x1b[K%s", text.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(options_.out, "%s\n", text.c_str());
  }
  std::fflush(options_.out);
  last_print_ = now();
  ++lines_printed_;
}

}  // namespace dpar
