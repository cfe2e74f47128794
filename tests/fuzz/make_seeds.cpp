// fuzz_make_seeds <corpus root>: writes a seed corpus for every fuzz target under
// <root>/<target>/, from dpar's own writers (the files the tests make: exported fp32 and int8
// models, safetensors, checkpoints, event files, JPEG/PNG images, idx files) and well-formed
// launcher inputs and RPC scripts. Seeds give the fuzzers the formats' structure to mutate.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "dpar/core/random.h"
#include "dpar/data/image.h"
#include "dpar/distributed/optimizer_shards.h"
#include "dpar/io/checkpoint.h"
#include "dpar/io/onnx_quantize.h"
#include "dpar/io/safetensors.h"
#include "dpar/io/summary_writer.h"
#include "dpar/nn/init.h"
#include "io/checkpoint_format.h"
#include "ps.pb.h"
#include "store.pb.h"
#include "tiny_model.h"

namespace fs = std::filesystem;
using namespace dpar;

namespace {

fs::path root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / name, std::ios::binary) << bytes;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string u16le(size_t n) { return {static_cast<char>(n & 0xff), static_cast<char>(n >> 8)}; }

// One call of an RPC script (tests/fuzz/rpc_script.h): method, identity flags, request.
std::string raw_call(int method, int flags, const std::string& body) {
  return std::string{static_cast<char>(method), static_cast<char>(flags)} + u16le(body.size()) +
         body;
}

std::string rpc_call(int method, int flags, const google::protobuf::MessageLite& request) {
  return raw_call(method, flags, request.SerializeAsString());
}

// A streamed call's body: each message with a one-byte length.
std::string stream_of(std::initializer_list<const google::protobuf::MessageLite*> messages) {
  std::string out;
  for (const auto* m : messages) {
    const std::string b = m->SerializeAsString();
    out += static_cast<char>(b.size());
    out += b;
  }
  return out;
}

void model_seeds(const fs::path& scratch) {
  fuzz::TinyRun run;
  run.net->eval();
  io::OnnxExportOptions o;
  o.model_name = "tiny";
  o.height = o.width = fuzz::kTinyImageSide;
  o.class_names = {"a", "b", "c"};
  put("fuzz_onnx_model", "fp32.onnx",
      slurp(io::export_onnx(*run.net, (scratch / "fp32").string(), o).model_path));
  o.graph_pass = [](io::OnnxGraph& g) {
    io::OnnxCalibrator calibrator(g);
    Generator rng(3);
    calibrator.observe(nn::init::uniform_(
        Tensor::empty({2, 3, fuzz::kTinyImageSide, fuzz::kTinyImageSide}), 0.0, 1.0, rng));
    io::quantize_qdq(g, calibrator);
  };
  put("fuzz_onnx_model", "int8.onnx",
      slurp(io::export_onnx(*run.net, (scratch / "int8").string(), o).model_path));

  const fs::path st = scratch / "weights.safetensors";
  io::save_safetensors(st.string(),
                       {{"w", Tensor::ones({2, 3})},
                        {"h", Tensor::ones({4}).to(DType::f16)},
                        {"b", Tensor::ones({2, 2}).to(DType::bf16)},
                        {"i", Tensor::zeros({3}, DType::i64)},
                        {"u", Tensor::zeros({5}, DType::u8)}},
                       {{"format", "pt"}});
  put("fuzz_safetensors", "mixed.safetensors", slurp(st));

  io::TrainingState state;
  state.model_name = "tiny";
  state.global_step = 7;
  state.epoch = 1;
  state.steps_per_epoch = 4;
  state.step_in_epoch = 3;
  const fs::path ck = scratch / "tiny.ckpt";
  io::save_checkpoint(ck.string(), io::capture_checkpoint(*run.net, &run.opt, nullptr, state));
  put("fuzz_checkpoint", "tiny.ckpt", slurp(ck));
  put("fuzz_checkpoint", "state.json", io::detail::state_to_json(state));

  // A shard set of the tiny net's SGD state after one step: index.json and its one file,
  // packed as split_two reads them.
  run.net->train();
  run.opt.zero_grad();
  sum(run.net->forward(Tensor::ones({2, 3, fuzz::kTinyImageSide, fuzz::kTinyImageSide})))
      .backward();
  run.opt.step();
  const fs::path set = scratch / "set";
  dist::save_optimizer_shards(
      set.string(), dist::whole_parameter_layout(run.net->named_parameters()), run.opt, nullptr);
  const std::string index = slurp(set / "index.json");
  std::string packed{static_cast<char>(index.size() & 0xff),
                     static_cast<char>((index.size() >> 8) & 0xff)};
  packed += index + slurp(set / "rank-0-of-1.safetensors");
  put("fuzz_optimizer_shards", "sgd_step.set", packed);
}

// A BMP file (BITMAPINFOHEADER, uncompressed) of width x height pixels at 24 or 8 bits, with a
// grey palette at 8 bits; rows padded to 4 bytes as the format wants.
std::string bmp_seed(int32_t width, int32_t height, uint16_t bits) {
  std::string out;
  auto le = [&out](uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
  };
  const uint32_t palette = bits == 8 ? 256 * 4 : 0;
  const uint32_t row = (static_cast<uint32_t>(width) * bits / 8 + 3) & ~3u;
  const uint32_t pixels = row * static_cast<uint32_t>(height < 0 ? -height : height);
  out += "BM";
  le(14 + 40 + palette + pixels, 4);  // file size
  le(0, 4);                           // reserved
  le(14 + 40 + palette, 4);           // offset of the pixels
  le(40, 4);
  le(static_cast<uint32_t>(width), 4);
  le(static_cast<uint32_t>(height), 4);
  le(1, 2);  // planes
  le(bits, 2);
  for (int i = 0; i < 6; ++i) le(0, 4);  // compression, sizes, resolution, palette counts
  for (uint32_t i = 0; i < palette / 4; ++i) le(i * 0x010101u, 4);
  for (uint32_t i = 0; i < pixels; ++i) out.push_back(static_cast<char>(i * 29));
  return out;
}

void file_seeds(const fs::path& scratch) {
  {
    io::SummaryWriter w((scratch / "tb").string(), ".seed");
    w.add_scalar("loss", 2.5, 1);
    w.add_scalars({{"lr", 0.1}, {"top1", 0.5}}, 2);
    w.close();
    put("fuzz_event_file", "events", slurp(w.path()));
  }
  data::Image rgb(6, 5, 3), grey(4, 7, 1);
  for (size_t i = 0; i < rgb.pixels.size(); ++i) rgb.pixels[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < grey.pixels.size(); ++i) grey.pixels[i] = static_cast<uint8_t>(i * 13);
  data::write_jpeg((scratch / "a.jpg").string(), rgb);
  data::write_png((scratch / "a.png").string(), rgb);
  data::write_png((scratch / "g.png").string(), grey);
  for (const char* n : {"a.jpg", "a.png", "g.png"}) put("fuzz_image", n, slurp(scratch / n));
  // dpar writes no BMP, but ImageFolder reads them: a 3x2 24-bit bottom-up one and a top-down
  // (negative height) 8-bit paletted one, built here.
  put("fuzz_image", "a.bmp", bmp_seed(3, 2, 24));
  put("fuzz_image", "g.bmp", bmp_seed(3, -2, 8));

  // Two 28x28 images and their labels, as the idx target splits its input.
  std::string images = std::string("\0\0\x08\x03", 4) +
                       std::string("\0\0\0\x02\0\0\0\x1c\0\0\0\x1c", 12) +
                       std::string(2 * 28 * 28, '\x40');
  std::string labels = std::string("\0\0\x08\x01\0\0\0\x02", 8) + std::string("\x03\x07", 2);
  put("fuzz_idx", "two", u16le(images.size()) + images + labels);
}

void launch_seeds() {
  const auto words = [](std::initializer_list<const char*> w) {
    std::string out(1, '\0');
    for (const char* s : w) out += std::string(s) + '\n';
    out.pop_back();
    return out;
  };
  put("fuzz_launch_parse", "ips",
      words({"--ips=127.0.0.1,127.0.0.2", "--gpus=0,1", "./train", "--epochs", "2"}));
  put("fuzz_launch_parse", "nproc",
      words({"--nproc_per_node=4", "--log_dir=out", "--master=127.0.0.1:6170", "./train"}));
  put("fuzz_launch_parse", "ps",
      words({"--run_mode=ps", "--servers=127.0.0.1:6170,127.0.0.1:6171",
             "--trainers=127.0.0.1,127.0.0.1", "./train"}));
  put("fuzz_launch_parse", "hostfile",
      "\x01# nodes\n127.0.0.1 slots=2\n10.0.0.2 slots=2\n10.0.0.3\n");
  put("fuzz_launch_parse", "hostfile_gpus",
      "\x02"
      "127.0.0.1 slots=3\n10.0.0.2\n");
  put("fuzz_launch_parse", "rank_table",
      "\x03"
      R"({"version": "1.0", "server_count": "2",
 "server_list": [
  {"server_id": "10.0.0.1", "device": [
    {"device_id": "0", "device_ip": "192.0.2.1", "rank_id": "3"},
    {"device_id": "1", "device_ip": "192.0.2.2", "rank_id": "0"}]},
  {"server_id": "10.0.0.2", "device": [
    {"device_id": 4, "rank_id": 1}, {"device_id": 5, "rank_id": 2}]}],
 "status": "completed"})");
}

void rpc_seeds() {
  namespace st = dpar::rpc::store;
  st::HelloRequest hello;
  hello.set_job_id("fuzz-job");
  hello.set_world_size(2);
  hello.set_rank(1);
  st::SetRequest set;
  set.set_key("k");
  set.set_value("v");
  st::AddRequest add;
  add.set_key("n");
  add.set_delta(5);
  st::GetRequest get;
  get.set_key("k");
  get.set_timeout_ms(10);
  st::CompareSetRequest cas;
  cas.set_key("k");
  cas.set_expected("v");
  cas.set_desired("w");
  st::WaitRequest wait;
  wait.add_keys("k");
  wait.add_keys("missing");
  wait.set_timeout_ms(10);
  st::CheckRequest check;
  check.add_keys("n");
  put("fuzz_store_rpc", "session",
      rpc_call(0, 0x40, hello) + rpc_call(1, 0, set) + rpc_call(3, 0, add) + rpc_call(3, 0, add) +
          rpc_call(2, 0, get) + rpc_call(4, 0, cas) + rpc_call(5, 0, wait) + rpc_call(6, 0, check));
  put("fuzz_store_rpc", "strangers",
      rpc_call(1, 1, set) + rpc_call(1, 2, set) + rpc_call(0, 4, hello));

  namespace ps = dpar::rpc::ps;
  ps::Layout layout;
  auto* p = layout.add_params();
  p->set_name("w");
  p->set_numel(6);
  layout.set_block_size(4);
  layout.set_num_servers(1);
  ps::ModeConfig mode;
  mode.set_mode("sync");
  mode.set_num_trainers(2);
  ps::HelloRequest phello;
  phello.set_trainer_id(0);
  *phello.mutable_layout() = layout;
  *phello.mutable_mode() = mode;
  ps::InitMessage init;
  *init.mutable_header()->mutable_layout() = layout;
  *init.mutable_header()->mutable_mode() = mode;
  init.mutable_header()->mutable_optimizer()->set_kind("sgd");
  init.set_data(std::string(24, '\0'));
  ps::PushMessage push;
  push.mutable_header()->set_step(0);
  push.mutable_header()->set_lr(0.1);
  push.mutable_header()->set_weight(1);
  push.set_data(std::string(24, '\x01'));
  ps::PullRequest pull;
  pull.set_min_version(0);
  ps::SaveRequest save;
  save.set_step(1);
  ps::FinishRequest finish;
  put("fuzz_ps_rpc", "sync_step",
      rpc_call(0, 0, phello) + raw_call(1, 0, stream_of({&init})) +
          raw_call(2, 0, stream_of({&push})) + raw_call(2, 8, stream_of({&push})) +
          rpc_call(3, 0, pull) + rpc_call(4, 0, save) + rpc_call(5, 0, finish) +
          rpc_call(5, 8, finish));
  mode.set_mode("async");
  *init.mutable_header()->mutable_mode() = mode;
  init.mutable_header()->mutable_optimizer()->set_kind("adamw");
  put("fuzz_ps_rpc", "async",
      raw_call(1, 0, stream_of({&init})) + raw_call(2, 0, stream_of({&push})) +
          rpc_call(3, 8, pull) + rpc_call(6, 0, finish));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds <corpus root>\n");
    return 2;
  }
  root = argv[1];
  const fs::path scratch = fs::temp_directory_path() / ("dpar-seeds-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  try {
    model_seeds(scratch);
    file_seeds(scratch);
    launch_seeds();
    rpc_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", e.what());
    fs::remove_all(scratch);
    return 1;
  }
  fs::remove_all(scratch);
  std::printf("fuzz_make_seeds: seeds under %s\n", root.c_str());
  return 0;
}
