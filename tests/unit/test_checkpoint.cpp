// Checkpoints: exact resume, the verified file format (torn / corrupt / foreign files), model
// mismatches, and the CheckpointManager's directory layout (rotation, latest, best, resume
// lookup that skips a corrupt newest file).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "dpar/dpar.h"
#include "dpar/io/checkpoint.h"
#include "dpar/nn/weights.h"
#include "dpar/optim/lr_scheduler.h"
#include "dpar/optim/sgd.h"
#include "gradcheck.h"
#include "io/checkpoint_format.h"
#include "unit/helpers.h"

using namespace dpar;
namespace fs = std::filesystem;
using dpar::testing::random_tensor;

namespace {

// A small net with every kind of state a checkpoint must carry: conv and linear weights, BN
// running statistics, and a dropout drawing from the default generator.
std::shared_ptr<nn::Sequential> make_net(int64_t classes = 3) {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::BatchNorm2d>(4),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(1),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Dropout>(0.3),
      std::make_shared<nn::Linear>(4, classes)});
}

struct Run {
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<optim::CosineWarmupLR> sched;
  explicit Run(uint64_t seed, int64_t classes = 3) {
    manual_seed(seed);
    net = make_net(classes);
    net->train();
    opt = std::make_unique<optim::SGD>(
        net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    sched = std::make_unique<optim::CosineWarmupLR>(*opt, 10, 2);
  }
  void step(int64_t k) {
    Generator data(100 + static_cast<uint64_t>(k));
    Tensor x = random_tensor({4, 3, 6, 6}, data);
    Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, static_cast<int64_t>(k % 3)}, {4});
    opt->zero_grad();
    cross_entropy(net->forward(x), y).backward();
    opt->step();
    sched->step();
  }
  io::Checkpoint capture(int64_t global_step) const {
    io::TrainingState s;
    s.model_name = "tiny";
    s.global_step = global_step;
    s.epoch = global_step / 4;
    s.step_in_epoch = global_step % 4;
    s.steps_per_epoch = 4;
    return io::capture_checkpoint(*net, opt.get(), sched.get(), s);
  }
};

bool same_bits(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor x = a[i].second.contiguous(), y = b[i].second.contiguous();
    if (a[i].first != b[i].first || x.shape() != y.shape() || x.nbytes() != y.nbytes() ||
        std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

void flip_byte(const std::string& path, std::streamoff from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-from_end, std::ios::end);
  c = static_cast<char>(c ^ 0x10);
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("generator state round trip keeps the pending normal", "[checkpoint]") {
  Generator g(3);
  g.normal();  // leaves the Box-Muller spare pending
  Generator h(9);
  h.set_state(g.state());
  CHECK(g.normal() == h.normal());
  CHECK(g.next_u64() == h.next_u64());
  CHECK_THROWS_WITH(h.set_state("garbage"), Catch::Contains("malformed"));
}

TEST_CASE("save, load and restore continue bitwise", "[checkpoint]") {
  TempDir dir;
  Run a(1);
  for (int64_t k = 0; k < 6; ++k) a.step(k);

  Run b(1);
  for (int64_t k = 0; k < 3; ++k) b.step(k);
  const std::string path = dir / "mid.ckpt";
  io::save_checkpoint(path, b.capture(3));
  CHECK_FALSE(fs::exists(path + ".tmp"));

  Run c(77);  // other initial weights and generator state: all must come from the file
  const io::Checkpoint loaded = io::load_checkpoint(path);
  CHECK(loaded.state.global_step == 3);
  CHECK(loaded.state.model_name == "tiny");
  CHECK(loaded.state.extra.at("optimizer") == "SGD");
  CHECK(loaded.state.dpar_version == version());
  io::restore_checkpoint(loaded, *c.net, c.opt.get(), c.sched.get(), path);
  CHECK(c.sched->last_step() == 3);
  CHECK(c.opt->lr() == b.opt->lr());
  for (int64_t k = 3; k < 6; ++k) c.step(k);
  CHECK(same_bits(a.net->state_dict(), c.net->state_dict()));
  CHECK(same_bits(a.opt->state_dict(), c.opt->state_dict()));
}

TEST_CASE("checkpoint writes report their progress in bytes up to the file's size",
          "[checkpoint]") {
  TempDir dir;
  Run a(1);
  std::vector<std::pair<int64_t, int64_t>> heard;
  io::CheckpointManager manager(dir.path.string(), {.progress = [&](int64_t done, int64_t total) {
                                  heard.emplace_back(done, total);
                                }});
  const std::string path = manager.save_step(a.capture(1));
  REQUIRE(heard.size() > 2);
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  for (size_t i = 0; i < heard.size(); ++i) {
    CHECK(heard[i].second == size);
    if (i > 0) CHECK(heard[i].first >= heard[i - 1].first);
  }
  CHECK(heard.back().first == size);
}

TEST_CASE("torn, corrupt and foreign files are clear errors", "[checkpoint]") {
  TempDir dir;
  Run a(2);
  a.step(0);
  const std::string path = dir / "a.ckpt";
  io::save_checkpoint(path, a.capture(1));
  const auto size = fs::file_size(path);

  SECTION("a flipped data byte fails the checksum") {
    flip_byte(path, 3);
    const std::string e = error_of([&] { io::load_checkpoint(path); });
    CHECK_THAT(e,
               Catch::Contains(path) && Catch::Contains("corrupt") && Catch::Contains("checksum"));
  }
  SECTION("a truncated file names the file") {
    fs::resize_file(path, size - 100);
    const std::string e = error_of([&] { io::load_checkpoint(path); });
    CHECK_THAT(e, Catch::Contains(path) && Catch::Contains("truncated"));
    fs::resize_file(path, 5);
    CHECK_THAT(error_of([&] { io::load_checkpoint(path); }), Catch::Contains("truncated"));
  }
  SECTION("a missing file") {
    CHECK_THAT(error_of([&] { io::load_checkpoint(dir / "nope.ckpt"); }),
               Catch::Contains("nope.ckpt: no such file"));
  }
  SECTION("a plain weights file is not a checkpoint, but loads as weights") {
    const std::string weights = dir / "w.safetensors";
    nn::save_weights(*a.net, weights);
    CHECK_THAT(error_of([&] { io::load_checkpoint(weights); }),
               Catch::Contains("is not a dpar checkpoint"));
    CHECK_FALSE(io::is_checkpoint_file(weights));
    CHECK(io::is_checkpoint_file(path));
    Run b(5);
    CHECK(io::load_model_weights(*b.net, weights).ok());
    Run c(6);
    CHECK(io::load_model_weights(*c.net, path).ok());  // the model part of a checkpoint
    CHECK(same_bits(b.net->state_dict(), c.net->state_dict()));
  }
  SECTION("an interrupted write leaves the previous file intact") {
    // What a crash mid-save leaves: a partial temporary next to the complete old file.
    {
      std::ofstream tmp(path + ".tmp", std::ios::binary);
      tmp << "partial";
    }
    CHECK(io::load_checkpoint(path).state.global_step == 1);
    // The next save replaces the stale temporary and the file atomically.
    a.step(1);
    io::save_checkpoint(path, a.capture(2));
    CHECK(io::load_checkpoint(path).state.global_step == 2);
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
}

TEST_CASE("training-state numbers that do not fit their fields are clear errors", "[checkpoint]") {
  io::TrainingState state;
  state.epoch = 3;
  const std::string good = io::detail::state_to_json(state);
  CHECK(io::detail::state_from_json(good, "x.ckpt").epoch == 3);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  // A float far beyond int64 (fuzz_checkpoint found nlohmann converting it with a cast).
  CHECK_THAT(
      error_of(
          [&] { io::detail::state_from_json(with("\"epoch\":3", "\"epoch\":1.4e76"), "x.ckpt"); }),
      Catch::Contains("x.ckpt") && Catch::Contains("epoch is 1.4e+76, not a 64-bit integer"));
  CHECK_THAT(error_of([&] {
               io::detail::state_from_json(with("\"epoch\":3", "\"epoch\":2.5"), "x.ckpt");
             }),
             Catch::Contains("epoch is 2.5, not a 64-bit integer"));
  CHECK_THAT(error_of([&] {
               io::detail::state_from_json(with("\"epoch\":3", "\"epoch\":18446744073709551615"),
                                           "x.ckpt");
             }),
             Catch::Contains("not a 64-bit integer"));
  CHECK_THAT(
      error_of([&] { io::detail::state_from_json(with("\"seed\":0", "\"seed\":-1"), "x.ckpt"); }),
      Catch::Contains("seed is -1, not an unsigned 64-bit integer"));
}

TEST_CASE("a checkpoint of another model lists the mismatches and loads nothing", "[checkpoint]") {
  TempDir dir;
  Run a(3, /*classes=*/3);
  a.step(0);
  const std::string path = dir / "a.ckpt";
  io::save_checkpoint(path, a.capture(1));
  Run other(4, /*classes=*/5);
  const nn::NamedTensors before = other.net->state_dict();
  std::vector<Tensor> snapshot;
  for (const auto& [n, t] : before) snapshot.push_back(t.clone());
  const io::Checkpoint ckpt = io::load_checkpoint(path);
  const std::string e = error_of(
      [&] { io::restore_checkpoint(ckpt, *other.net, other.opt.get(), other.sched.get(), path); });
  CHECK_THAT(e, Catch::Contains(path) && Catch::Contains("tiny") &&
                    Catch::Contains("nothing was loaded") && Catch::Contains("2 mis-shaped") &&
                    Catch::Contains("6.weight: model [5,4] vs checkpoint [3,4]") &&
                    Catch::Contains("6.bias"));
  CHECK(e.find('\n') == std::string::npos);  // one line
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(std::memcmp(before[i].second.contiguous().raw_data(), snapshot[i].contiguous().raw_data(),
                      snapshot[i].nbytes()) == 0);
  }
  CHECK(other.sched->last_step() == 0);

  nn::LoadReport r;
  r.missing = {"a", "b", "c"};
  r.unexpected = {"x"};
  CHECK(io::describe_mismatch(r, 2) ==
        "3 missing from the checkpoint (a, b, ... 1 more); 1 unexpected (x)");
}

TEST_CASE("manager: rotation, latest, best, rank 0 only", "[checkpoint]") {
  TempDir dir;
  Run a(5);
  io::CheckpointManager mgr(dir / "ck", {.max_num_checkpoints = 2, .rank = 0});
  io::CheckpointManager other_rank(dir / "ck", {.max_num_checkpoints = 2, .rank = 1});
  for (int64_t k = 1; k <= 5; ++k) {
    a.step(k);
    const io::Checkpoint c = a.capture(k);
    CHECK(other_rank.save_step(c).empty());
    if (k == 4) {
      CHECK(mgr.save_epoch(c, 0, /*is_best=*/true) == mgr.epoch_path(0));
    } else {
      CHECK(mgr.save_step(c) == mgr.step_path(k));
    }
  }
  // Newest two rotating files (model_0 at step 4, step_5), plus latest and best.
  std::vector<std::string> names;
  for (const auto& p : mgr.list()) names.push_back(fs::path(p).filename().string());
  CHECK(names ==
        std::vector<std::string>{"best.ckpt", "latest.ckpt", "model_0.ckpt", "step_5.ckpt"});
  CHECK(io::read_checkpoint_state(mgr.latest_path()).global_step == 5);
  CHECK(io::read_checkpoint_state(mgr.best_path()).global_step == 4);

  // best survives the rotation removing model_0 (it is its own name for the same bytes).
  a.step(6);
  mgr.save_step(a.capture(6));
  CHECK_FALSE(fs::exists(mgr.epoch_path(0)));
  CHECK(io::load_checkpoint(mgr.best_path()).state.global_step == 4);

  std::string found;
  auto latest = mgr.load_latest_valid(&found);
  REQUIRE(latest);
  CHECK(latest->state.global_step == 6);
  CHECK(found == mgr.step_path(6));
}

TEST_CASE("manager: resume skips a corrupt newest checkpoint with a warning", "[checkpoint]") {
  TempDir dir;
  std::vector<std::string> warnings;
  io::CheckpointManagerOptions options{.max_num_checkpoints = 0, .rank = 0};
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  io::CheckpointManager mgr(dir / "ck", options);
  CHECK_FALSE(mgr.load_latest_valid());  // empty directory: start from scratch

  Run a(6);
  for (int64_t k = 1; k <= 3; ++k) {
    a.step(k);
    mgr.save_step(a.capture(k));
  }
  flip_byte(mgr.step_path(3), 1);  // latest.ckpt is the same file: corrupt too
  std::string found;
  auto ckpt = mgr.load_latest_valid(&found);
  REQUIRE(ckpt);
  CHECK(ckpt->state.global_step == 2);
  CHECK(found == mgr.step_path(2));
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("step_3.ckpt") && Catch::Contains("corrupt"));

  // Truncate the newest valid one too: a torn header is reported when listing.
  warnings.clear();
  fs::resize_file(mgr.step_path(2), 4);
  ckpt = mgr.load_latest_valid(&found);
  REQUIRE(ckpt);
  CHECK(ckpt->state.global_step == 1);
  CHECK(warnings.size() == 2);

  // All unusable: an error listing them.
  fs::resize_file(mgr.step_path(1), 4);
  CHECK_THAT(error_of([&] { mgr.load_latest_valid(); }),
             Catch::Contains("no valid checkpoint in") && Catch::Contains("step_1.ckpt"));

  // adopt_existing() removes leftovers of interrupted writes.
  { std::ofstream(mgr.step_path(9) + ".tmp") << "x"; }
  mgr.adopt_existing(2);
  CHECK_FALSE(fs::exists(mgr.step_path(9) + ".tmp"));
}

TEST_CASE("manager: a folder holding another run's checkpoints is refused, resumed or replaced",
          "[checkpoint]") {
  TempDir dir;
  Run a(5);
  {
    io::CheckpointManager first(dir / "ck", {.max_num_checkpoints = 2});
    for (int64_t k = 1; k <= 3; ++k) {
      a.step(k);
      first.save_step(a.capture(k));
    }
  }
  // A second run into the same folder: refused, naming the folder and its files.
  CHECK_THAT(error_of([&] { io::CheckpointManager second(dir / "ck"); }),
             Catch::Contains("already holds 3 checkpoint(s) of an earlier run (latest.ckpt, "
                             "step_2.ckpt, step_3.ckpt)") &&
                 Catch::Contains("on_existing = OnExisting::resume"));
  // Other ranks write nothing, so they do not look.
  CHECK_NOTHROW(io::CheckpointManager(dir / "ck", {.rank = 1}));

  // read_only lists and loads but never writes.
  io::CheckpointManager reader(dir / "ck", {.on_existing = io::OnExisting::read_only});
  REQUIRE(reader.load_latest_valid());
  CHECK(reader.load_latest_valid()->state.global_step == 3);
  CHECK_THAT(error_of([&] { reader.save_step(a.capture(3)); }), Catch::Contains("read_only"));

  // resume: the earlier files join the rotation by themselves (no adopt_existing call), so
  // max_num_checkpoints keeps counting them.
  {
    io::CheckpointManager resumed(
        dir / "ck", {.on_existing = io::OnExisting::resume, .max_num_checkpoints = 2});
    a.step(4);
    resumed.save_step(a.capture(4));
    CHECK_FALSE(fs::exists(resumed.step_path(2)));
    CHECK(fs::exists(resumed.step_path(3)));
    CHECK(io::read_checkpoint_state(resumed.latest_path()).global_step == 4);
  }

  // overwrite: the earlier run's files are gone, with a note.
  std::vector<std::string> notes;
  io::CheckpointManagerOptions options{.on_existing = io::OnExisting::overwrite};
  options.warn = [&](const std::string& w) { notes.push_back(w); };
  io::CheckpointManager fresh(dir / "ck", options);
  CHECK(fresh.list().empty());
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Catch::Contains("removed 3 checkpoint(s) of an earlier run"));
}
