#include <catch2/catch.hpp>

#include "dpar/core/flags.h"

using namespace dpar;

TEST_CASE("flags parse both spellings and value forms", "[flags]") {
  Flags f("prog", "test program");
  auto& dir = f.add_string("log_dir", "log", "where logs go");
  auto& n = f.add_int("nproc-per-node", 1, "processes");
  auto& lr = f.add_double("lr", 0.1, "learning rate");
  auto& gpu = f.add_bool("use_gpu", false, "use the GPU");
  auto& gpus = f.add_string("gpus", "", "GPU list");
  f.add_alias("devices", "gpus");
  auto rest = f.parse({"--log-dir=/tmp/x", "--nproc_per_node", "4", "--lr=0.5", "--use-gpu=True",
                       "--devices=0,1", "--", "a"});
  CHECK(dir == "/tmp/x");
  CHECK(n == 4);
  CHECK(lr == 0.5);
  CHECK(gpu);
  CHECK(gpus == "0,1");
  CHECK(rest == std::vector<std::string>{"a"});
  CHECK(f.was_set("log_dir"));
  CHECK_FALSE(Flags("p", "").was_set("x"));
}

TEST_CASE("flags: launcher style stops at the program", "[flags]") {
  Flags f("launch", "");
  auto& n = f.add_int("nproc_per_node", 1, "");
  auto rest =
      f.parse({"--nproc_per_node=2", "./train", "--epochs", "3"}, /*allow_positional=*/true);
  CHECK(n == 2);
  CHECK(rest == std::vector<std::string>{"./train", "--epochs", "3"});
}

TEST_CASE("flags: a string flag with an implicit value may be given bare", "[flags]") {
  auto parse = [](const std::vector<std::string>& args) {
    Flags f("train", "");
    auto& tb = f.add_string("tensorboard", "", "");
    auto& epochs = f.add_int("epochs", 1, "");
    f.set_implicit_value("tensorboard", "output/tb");
    f.parse(args);
    return tb + "|" + std::to_string(epochs);
  };
  CHECK(parse({}) == "|1");
  CHECK(parse({"--tensorboard"}) == "output/tb|1");
  CHECK(parse({"--tensorboard", "--epochs", "2"}) == "output/tb|2");
  CHECK(parse({"--tensorboard", "runs/a", "--epochs=2"}) == "runs/a|2");
  CHECK(parse({"--tensorboard=runs/b"}) == "runs/b|1");
  Flags f("prog", "");
  f.add_int("epochs", 1, "");
  CHECK_THROWS_WITH(f.set_implicit_value("epochs", "2"), Catch::Contains("needs a string flag"));
}

TEST_CASE("flags: bad input is one clear FlagError", "[flags][errors]") {
  Flags f("prog", "");
  f.add_int("epochs", 1, "");
  f.add_bool("amp", false, "");
  CHECK_THROWS_AS(f.parse({"--epoch=3"}), FlagError);
  CHECK_THROWS_WITH(f.parse({"--epoch=3"}),
                    "prog: unknown flag --epoch (did you mean --epochs? see --help)");
  CHECK_THROWS_WITH(f.parse({"--zzz"}), "prog: unknown flag --zzz (see --help)");
  CHECK_THROWS_WITH(f.parse({"--epochs=three"}), "prog: --epochs=three: expected an integer");
  CHECK_THROWS_WITH(f.parse({"--epochs"}), "prog: --epochs needs a value");
  CHECK_THROWS_WITH(f.parse({"--amp=maybe"}), "prog: --amp=maybe: expected true or false");
  CHECK_THROWS_WITH(f.parse({"stray"}), Catch::Contains("unexpected argument 'stray'"));
}

TEST_CASE("flags: a typo or a short flag names the nearest long flags", "[flags][errors]") {
  Flags f("launch", "");
  f.add_int("nproc_per_node", 1, "");
  f.add_int("node_rank", -1, "");
  f.add_string("log_dir", "log", "");
  f.add_int("lines", 0, "");
  f.add_alias("devices", "log_dir");
  // One edit away, either separator.
  CHECK_THROWS_WITH(
      f.parse({"--nproc_per_nod=2"}, true),
      Catch::Contains("unknown flag --nproc_per_nod (did you mean --nproc-per-node?"));
  // A prefix lists every flag it starts; a shortened name is not silently accepted.
  CHECK_THROWS_WITH(f.parse({"--nproc=2"}, true),
                    Catch::Contains("did you mean --nproc-per-node?"));
  // "-n 2" is a flag mistake, not a program called "-n" (the launcher's positional mode).
  CHECK_THROWS_WITH(f.parse({"-n", "2", "prog"}, true),
                    "launch: unknown flag -n (flags start with --; did you mean one of "
                    "--node-rank, --nproc-per-node? see --help)");
  CHECK_THROWS_WITH(f.parse({"-l=x", "prog"}, true), Catch::Contains("one of --lines, --log-dir?"));
  // Aliases are suggested too; far-off names get no guess.
  CHECK_THROWS_WITH(f.parse({"--device=1"}, true), Catch::Contains("did you mean --devices?"));
  CHECK_THROWS_WITH(f.parse({"-q"}, true),
                    "launch: unknown flag -q (flags start with --; see --help)");
  // Negative numbers stay values; after the program everything is its own.
  CHECK(f.parse({"--node_rank", "-1", "prog", "-n", "3"}, true) ==
        std::vector<std::string>{"prog", "-n", "3"});
}

TEST_CASE("run_main maps errors to exit codes", "[flags]") {
  CHECK(run_main("p", [] { return 0; }) == 0);
  CHECK(run_main("p", []() -> int { throw FlagError("bad flag"); }) == 2);
  CHECK(run_main("p", []() -> int { throw Error("boom"); }) == 1);
}
