// Progress lines: rewritten in place on a terminal, plain lines into a log only for work that
// lasts, percent / rate / ETA figures from an injected clock.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "dpar/core/progress.h"

using namespace dpar;

namespace {

// Captures what a Progress writes, with a clock the test moves.
struct Capture {
  std::FILE* file = std::tmpfile();
  double clock = 100.0;
  ~Capture() { std::fclose(file); }
  ProgressOptions options(bool terminal) {
    ProgressOptions o;
    o.out = file;
    o.terminal = terminal;
    o.plain_interval_s = 5.0;
    o.clock = [this] { return clock; };
    return o;
  }
  std::string text() {
    std::fflush(file);
    std::rewind(file);
    std::string out;
    for (int c; (c = std::fgetc(file)) != EOF;) out.push_back(static_cast<char>(c));
    return out;
  }
};

}  // namespace

TEST_CASE("Progress line gives percent, counts, rate and ETA", "[progress]") {
  Capture cap;
  Progress p("eval", 1000, "images", cap.options(false));
  cap.clock += 2.0;
  p.update(250);
  CHECK(p.line() == "eval: 25% (250/1000 images), 125.0 images/s, ETA 6.0 s");
  p.update(1000);
  CHECK(p.line() == "eval: 100% (1000/1000 images), 500.0 images/s, 2.0 s");
  Progress whole("ckpt", 12.339441, "MB", cap.options(false));
  whole.update(12.339441);
  CHECK_THAT(whole.line(), Catch::StartsWith("ckpt: 100% (12.3/12.3 MB)"));
  CHECK(Progress("ckpt", 10.5, "MB", cap.options(false)).line() ==
        "ckpt: 0% (0/10.5 MB), 0.0 MB/s, ETA ?");
}

TEST_CASE("Progress into a log: nothing for short work, plain lines for long work", "[progress]") {
  {
    Capture cap;
    Progress p("eval", 100, "images", cap.options(false));
    for (int i = 0; i < 10; ++i) {
      cap.clock += 0.1;
      p.advance(10);
    }
    p.finish();
    CHECK(cap.text().empty());
    CHECK(p.lines_printed() == 0);
  }
  Capture cap;
  Progress p("eval", 100, "images", cap.options(false));
  for (int i = 0; i < 10; ++i) {
    cap.clock += 2.0;  // 20 s in all: a line after 6 s, 12 s, 18 s, then the closing one
    p.advance(10);
  }
  p.finish();
  p.finish();  // idempotent
  const std::string text = cap.text();
  CHECK(text ==
        "eval: 30% (30/100 images), 5.0 images/s, ETA 14.0 s\n"
        "eval: 60% (60/100 images), 5.0 images/s, ETA 8.0 s\n"
        "eval: 90% (90/100 images), 5.0 images/s, ETA 2.0 s\n"
        "eval: 100% (100/100 images), 5.0 images/s, 20.0 s\n");
  CHECK(text.find('\r') == std::string::npos);
}

TEST_CASE("Progress on a terminal rewrites one line and ends it", "[progress]") {
  Capture cap;
  {
    Progress p("checkpoint", 4, "MB", cap.options(true));
    cap.clock += 1.0;
    p.update(2);
    cap.clock += 1.0;
    p.update(4);
  }  // the destructor finishes
  CHECK(cap.text() ==
        "\rcheckpoint: 50% (2/4 MB), 2.0 MB/s, ETA 1.0 s\x1b[K"
        "\rcheckpoint: 100% (4/4 MB), 2.0 MB/s, 2.0 s\x1b[K\n");
}
