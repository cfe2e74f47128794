// Parameter-server transfer throughput: push + pull of a 10 MB model (2.5 M floats) over 2
// ps::Servers from 2 trainers, sync mode, plain SGD, beside a bare gRPC streaming transfer of
// the same bytes (bench/bench_raw.proto) between the same processes, in the same run.
//
// Started on its own, the driver runs itself under `dpar-launch --run_mode=ps --server_num=2
// --trainer_num=2` (4 separate processes on 127.0.0.1) with --worker. Each server process
// serves both a ps::Server (ps::init_server / run_server) and a bare gRPC server on its own
// port. Each trainer holds a module of 4 parameters totalling 2.5 M floats and alternates
// blocks of --iters timed iterations: dpar (set gradients, ParameterServerTrainer::step(): push
// 10 MB and pull 10 MB, split over the 2 servers in parallel) and bare gRPC (upload 5 MB to each
// server in parallel, then download 5 MB from each in parallel; 1 MiB chunks, 16 MiB message
// limits, the bytes copied from / into a buffer on both sides as dpar does). Every block starts
// right after an untimed sync step, which lines the trainers up; its time is the span from the
// first trainer's start to the last trainer's end (CLOCK_MONOTONIC is shared by the processes).
// MB/s = bytes moved by all trainers (push + pull, 1 MB = 1e6 B) / that span.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "bench_raw.grpc.pb.h"
#include "bench_util.h"
#include "dpar/dpar.h"
#include "dpar/ps/ps.h"

using namespace dpar;
namespace raw = dpar::bench::raw;

namespace {

constexpr int64_t kChunkBytes = int64_t{1} << 20;  // as dpar's ps transport
constexpr int kMaxMessageBytes = 16 << 20;         // as dpar's ps transport, both ends

struct Settings {
  int64_t floats = 2500000;
  int64_t warmup = 3;
  int64_t iters = 20;
  int64_t reps = 3;
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs body(s) for every server at once: a thread per server beyond the first, the caller
// taking server 0 (what dpar's ps client does for each call).
void for_each_server(size_t servers, const std::function<void(size_t)>& body) {
  std::vector<std::thread> threads;
  for (size_t s = 1; s < servers; ++s) threads.emplace_back(body, s);
  body(0);
  for (std::thread& t : threads) t.join();
}

// ---- bare gRPC ---------------------------------------------------------------------------

class RawService final : public raw::RawTransfer::Service {
 public:
  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<raw::Chunk>* reader,
                      raw::UploadReply* reply) override {
    // The bytes land in a buffer, as a ps server's staging buffer; gRPC's sync server reuses
    // its threads, so after the warm-up no call allocates.
    thread_local std::vector<char> sink;
    raw::Chunk chunk;
    int64_t received = 0;
    while (reader->Read(&chunk)) {
      const std::string& data = chunk.data();
      if (sink.size() < static_cast<size_t>(received) + data.size()) {
        sink.resize(static_cast<size_t>(received) + data.size());
      }
      std::memcpy(sink.data() + received, data.data(), data.size());
      received += static_cast<int64_t>(data.size());
    }
    reply->set_bytes(received);
    return grpc::Status::OK;
  }

  grpc::Status Download(grpc::ServerContext*, const raw::DownloadRequest* request,
                        grpc::ServerWriter<raw::Chunk>* writer) override {
    const int64_t total = request->bytes();
    const int64_t chunk_bytes = request->chunk_bytes();
    if (total < 0 || chunk_bytes < 1 || chunk_bytes > kMaxMessageBytes / 2) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "bench_ps raw server: bad download request"};
    }
    const char* source = source_of(total);
    raw::Chunk chunk;
    for (int64_t off = 0; off < total; off += chunk_bytes) {
      chunk.set_data(source + off, static_cast<size_t>(std::min(chunk_bytes, total - off)));
      if (!writer->Write(chunk)) return {grpc::StatusCode::CANCELLED, "client went away"};
    }
    return grpc::Status::OK;
  }

 private:
  // The bytes a download sends (a ps server's shard), made once.
  const char* source_of(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (source_.size() < static_cast<size_t>(bytes)) source_.assign(static_cast<size_t>(bytes), 1);
    return source_.data();
  }
  std::mutex mu_;
  std::vector<char> source_;
};

class RawServer {
 public:
  explicit RawServer(const std::string& endpoint) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(endpoint, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    server_ = builder.BuildAndStart();
    DPAR_CHECK(server_ && port != 0, "bench_ps: the bare gRPC server cannot listen on ", endpoint);
  }
  ~RawServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }

 private:
  RawService service_;
  std::unique_ptr<grpc::Server> server_;
};

class RawClient {
 public:
  RawClient(const std::vector<std::string>& endpoints, int64_t total_bytes)
      : bytes_per_server_(total_bytes / static_cast<int64_t>(endpoints.size())),
        source_(static_cast<size_t>(total_bytes), 2),
        sink_(static_cast<size_t>(total_bytes)) {
    for (const std::string& ep : endpoints) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(kMaxMessageBytes);
      args.SetMaxSendMessageSize(kMaxMessageBytes);
      stubs_.push_back(raw::RawTransfer::NewStub(
          grpc::CreateCustomChannel(ep, grpc::InsecureChannelCredentials(), args)));
      endpoints_.push_back(ep);
    }
  }

  // Upload to every server in parallel, then download from every server in parallel.
  void iteration() {
    for_each_server(stubs_.size(), [&](size_t s) { upload(s); });
    for_each_server(stubs_.size(), [&](size_t s) { download(s); });
  }

 private:
  void upload(size_t s) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);  // the first call may come before the server listens
    raw::UploadReply reply;
    auto writer = stubs_[s]->Upload(&ctx, &reply);
    const char* from = source_.data() + static_cast<int64_t>(s) * bytes_per_server_;
    raw::Chunk chunk;
    for (int64_t off = 0; off < bytes_per_server_; off += kChunkBytes) {
      const int64_t len = std::min(kChunkBytes, bytes_per_server_ - off);
      // One copy, from the source straight into the message (as dpar's gradient gather).
      chunk.mutable_data()->resize(static_cast<size_t>(len));
      std::memcpy(chunk.mutable_data()->data(), from + off, static_cast<size_t>(len));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    DPAR_CHECK(st.ok(), "bench_ps: bare upload to ", endpoints_[s],
               " failed: ", st.error_message());
    DPAR_CHECK(reply.bytes() == bytes_per_server_, "bench_ps: ", endpoints_[s], " received ",
               reply.bytes(), " of ", bytes_per_server_, " bytes");
  }

  void download(size_t s) {
    grpc::ClientContext ctx;
    raw::DownloadRequest request;
    request.set_bytes(bytes_per_server_);
    request.set_chunk_bytes(kChunkBytes);
    auto reader = stubs_[s]->Download(&ctx, request);
    char* to = sink_.data() + static_cast<int64_t>(s) * bytes_per_server_;
    raw::Chunk chunk;
    int64_t received = 0;
    while (reader->Read(&chunk)) {
      const std::string& data = chunk.data();
      DPAR_CHECK(received + static_cast<int64_t>(data.size()) <= bytes_per_server_,
                 "bench_ps: ", endpoints_[s], " sent more than ", bytes_per_server_, " bytes");
      std::memcpy(to + received, data.data(), data.size());  // into the "parameters"
      received += static_cast<int64_t>(data.size());
    }
    const grpc::Status st = reader->Finish();
    DPAR_CHECK(st.ok(), "bench_ps: bare download from ", endpoints_[s],
               " failed: ", st.error_message());
    DPAR_CHECK(received == bytes_per_server_, "bench_ps: ", endpoints_[s], " sent ", received,
               " of ", bytes_per_server_, " bytes");
  }

  int64_t bytes_per_server_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<raw::RawTransfer::Stub>> stubs_;
  std::vector<char> source_;
  std::vector<char> sink_;
};

// ---- the model: 4 big parameters -----------------------------------------------------------

class FlatModel : public nn::Module {
 public:
  explicit FlatModel(int64_t floats) : nn::Module("FlatModel") {
    const int64_t parts = 4;
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t n = floats / parts + (i == parts - 1 ? floats % parts : 0);
      std::string name = "w";
      name += std::to_string(i);
      register_parameter(name, Tensor::full({n}, 0.01 * static_cast<double>(i)));
    }
  }
};

// ---- worker (one process of the ps job) -----------------------------------------------------

struct Block {
  std::string kind;  // "dpar" or "raw"
  int64_t rep = 0;
  int64_t t0_ns = 0, t1_ns = 0;
  double push_s = 0, pull_s = 0;  // dpar: this trainer's time in push / pull over the block
};

int run_server(const std::vector<std::string>& raw_endpoints) {
  const ps::PsEnv env = ps::env_from_environment();
  DPAR_CHECK(env.server_id < static_cast<int>(raw_endpoints.size()), "bench_ps: server ",
             env.server_id, " has no --raw-endpoints entry");
  // Up before the ps server, and alive until every trainer has finished (ps::run_server
  // returns only then), so it outlives the trainers' bare-gRPC blocks.
  RawServer raw_server(raw_endpoints[static_cast<size_t>(env.server_id)]);
  ps::init_server();
  ps::run_server();
  return 0;
}

int run_trainer(const Settings& cfg, const std::vector<std::string>& raw_endpoints,
                const std::string& result_dir) {
  const ps::PsEnv env = ps::env_from_environment();
  DPAR_CHECK(raw_endpoints.size() == env.server_endpoints.size(),
             "bench_ps: ", raw_endpoints.size(), " bare endpoints for ",
             env.server_endpoints.size(), " ps servers");
  FlatModel model(cfg.floats);
  optim::SGD opt(model.parameters(), {.lr = 0.01});
  ps::TrainerOptions options;
  options.mode = ps::Mode::kSync;
  options.log = [](const std::string&) {};
  ps::ParameterServerTrainer trainer(model, opt, env, options);

  // Two sets of gradients with different values; "setting the gradients" swaps handles.
  std::vector<Tensor> params = model.parameters();
  std::vector<std::vector<Tensor>> grads(2);
  for (size_t g = 0; g < 2; ++g) {
    for (const Tensor& p : params) grads[g].push_back(Tensor::full(p.shape(), g ? -1e-3 : 1e-3));
  }
  int64_t iteration = 0;
  auto dpar_step = [&] {
    const auto& set = grads[static_cast<size_t>(iteration++ % 2)];
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(set[i]);
    trainer.step();
  };
  RawClient raw_client(raw_endpoints, cfg.floats * 4);

  for (int64_t i = 0; i < cfg.warmup; ++i) dpar_step();
  for (int64_t i = 0; i < cfg.warmup; ++i) raw_client.iteration();

  std::vector<Block> blocks;
  auto timed = [&](const std::string& kind, int64_t rep) {
    dpar_step();  // untimed: a sync step returns on both trainers at the same moment
    const ps::TrainerStats before = trainer.stats();
    Block b{kind, rep, monotonic_ns(), 0, 0, 0};
    for (int64_t i = 0; i < cfg.iters; ++i) {
      if (kind == "dpar") {
        dpar_step();
      } else {
        raw_client.iteration();
      }
    }
    b.t1_ns = monotonic_ns();
    const ps::TrainerStats& after = trainer.stats();
    b.push_s = after.push_seconds - before.push_seconds;
    b.pull_s = after.pull_seconds - before.pull_seconds;
    blocks.push_back(b);
  };
  for (int64_t r = 0; r < cfg.reps; ++r) {
    // ABBA: neither side always runs first.
    if (r % 2 == 0) {
      timed("dpar", r);
      timed("raw", r);
    } else {
      timed("raw", r);
      timed("dpar", r);
    }
  }
  trainer.finish();

  const std::string path = result_dir + "/trainer" + std::to_string(env.trainer_id) + ".txt";
  std::ofstream out(path + ".tmp");
  for (const Block& b : blocks) {
    out << b.kind << " " << b.rep << " " << b.t0_ns << " " << b.t1_ns << " " << b.push_s << " "
        << b.pull_s << "\n";
  }
  out.close();
  DPAR_CHECK(out.good(), "bench_ps: cannot write ", path);
  std::filesystem::rename(path + ".tmp", path);
  return 0;
}

// ---- driver -----------------------------------------------------------------------------------

struct Span {
  int64_t t0 = INT64_MAX, t1 = 0;
  double push_s = 0, pull_s = 0;  // summed over trainers
  double seconds() const { return static_cast<double>(t1 - t0) * 1e-9; }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int run_driver(const Settings& cfg, const std::string& launcher, int64_t start_port) {
  constexpr int kServers = 2, kTrainers = 2;
  const int port =
      start_port > 0 ? static_cast<int>(start_port) : bench::pick_free_ports(2 * kServers);
  char dir_template[] = "/tmp/bench_ps.XXXXXX";
  DPAR_CHECK(mkdtemp(dir_template) != nullptr, "bench_ps: cannot create a directory in /tmp");
  const std::string dir = dir_template;
  std::string raw_endpoints;
  for (int s = 0; s < kServers; ++s) {
    if (s) raw_endpoints += ",";
    raw_endpoints += "127.0.0.1:";
    raw_endpoints += std::to_string(port + kServers + s);
  }
  const std::string cmd =
      launcher + " --run_mode=ps --server_num=" + std::to_string(kServers) +
      " --trainer_num=" + std::to_string(kTrainers) +
      " --ips=127.0.0.1 --start_port=" + std::to_string(port) + " --log_dir=" + dir + "/log " +
      bench::self_path() + " --worker --result-dir=" + dir + " --raw-endpoints=" + raw_endpoints +
      " --floats=" + std::to_string(cfg.floats) + " --warmup=" + std::to_string(cfg.warmup) +
      " --iters=" + std::to_string(cfg.iters) + " --reps=" + std::to_string(cfg.reps) + " > " +
      dir + "/launch.txt 2>&1";
  const std::string load_before = bench::load_average();
  const int status = std::system(cmd.c_str());
  DPAR_CHECK(status == 0, "bench_ps: the ps job failed (status ", status, "): ", cmd, "\n",
             read_text(dir + "/launch.txt"), "(process logs in ", dir, "/log)");

  // (kind, rep) -> span over the trainers.
  std::map<std::pair<std::string, int64_t>, Span> spans;
  for (int t = 0; t < kTrainers; ++t) {
    const std::string path = dir + "/trainer" + std::to_string(t) + ".txt";
    std::ifstream in(path);
    DPAR_CHECK(in.good(), "bench_ps: trainer ", t, " left no results (", path, ")");
    Block b;
    while (in >> b.kind >> b.rep >> b.t0_ns >> b.t1_ns >> b.push_s >> b.pull_s) {
      Span& s = spans[{b.kind, b.rep}];
      s.t0 = std::min(s.t0, b.t0_ns);
      s.t1 = std::max(s.t1, b.t1_ns);
      s.push_s += b.push_s;
      s.pull_s += b.pull_s;
    }
  }
  std::filesystem::remove_all(dir);

  const double model_bytes = static_cast<double>(cfg.floats) * 4;
  const double bytes = 2.0 * model_bytes * kTrainers * static_cast<double>(cfg.iters);
  const double iters = static_cast<double>(cfg.iters);
  std::vector<double> ours, theirs, ratio, ours_ms, theirs_ms, push_ms, pull_ms;
  for (int64_t r = 0; r < cfg.reps; ++r) {
    const Span& d = spans.at({"dpar", r});
    const Span& w = spans.at({"raw", r});
    ours.push_back(bytes / d.seconds() / 1e6);
    theirs.push_back(bytes / w.seconds() / 1e6);
    ratio.push_back(w.seconds() / d.seconds());
    ours_ms.push_back(d.seconds() / iters * 1e3);
    theirs_ms.push_back(w.seconds() / iters * 1e3);
    push_ms.push_back(d.push_s / kTrainers / iters * 1e3);
    pull_ms.push_back(d.pull_s / kTrainers / iters * 1e3);
  }
  const double ours_mbs = bench::median(ours), theirs_mbs = bench::median(theirs),
               r = bench::median(ratio);

  std::printf(
      "bench_ps: push+pull of a %.1f MB model (%lld floats), %d servers x %d trainers, sync "
      "mode, plain SGD\n",
      model_bytes / 1e6, static_cast<long long>(cfg.floats), kServers, kTrainers);
  std::printf(
      "  separate processes under dpar-launch --run_mode=ps on 127.0.0.1, %ld CPU(s); %lld "
      "timed iterations per block, %lld blocks each (alternating), medians\n",
      sysconf(_SC_NPROCESSORS_ONLN), static_cast<long long>(cfg.iters),
      static_cast<long long>(cfg.reps));
  std::printf("  MB/s = bytes pushed + pulled by all trainers (%.0f MB per iteration) / time\n",
              2.0 * model_bytes * kTrainers / 1e6);
  std::printf("  dpar ps     %8.1f MB/s  %7.1f ms/iteration (push %.1f ms + pull %.1f ms)\n",
              ours_mbs, bench::median(ours_ms), bench::median(push_ms), bench::median(pull_ms));
  std::printf(
      "  bare gRPC   %8.1f MB/s  %7.1f ms/iteration (client-stream upload + server-stream "
      "download, 1 MiB chunks)\n",
      theirs_mbs, bench::median(theirs_ms));
  std::printf("  ratio dpar/bare: %.2fx (median of per-block ratios; target >= 0.70)\n", r);
  std::printf("  per block MB/s dpar:");
  for (double v : ours) std::printf(" %.1f", v);
  std::printf(" | bare:");
  for (double v : theirs) std::printf(" %.1f", v);
  std::printf("\n  load average before / after: %s / %s\n", load_before.c_str(),
              bench::load_average().c_str());
  const nlohmann::json json = {{"bench", "bench_ps"},
                               {"model_bytes", model_bytes},
                               {"servers", kServers},
                               {"trainers", kTrainers},
                               {"processes", true},
                               {"iters", cfg.iters},
                               {"reps", cfg.reps},
                               {"dpar_mb_per_s", ours_mbs},
                               {"dpar_ms_per_iter", bench::median(ours_ms)},
                               {"bare_mb_per_s", theirs_mbs},
                               {"bare_ms_per_iter", bench::median(theirs_ms)},
                               {"ratio", r}};
  std::printf("%s\n", json.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("bench_ps", [&] {
    Flags flags("bench_ps",
                "Parameter-server push+pull throughput, 2 servers x 2 trainers: dpar vs bare "
                "gRPC streams in the same run");
    auto& floats = flags.add_int("floats", 2500000, "model size in floats (2.5 M = 10 MB)");
    auto& warmup = flags.add_int("warmup", 3, "untimed iterations of each side");
    auto& iters = flags.add_int("iters", 20, "timed iterations per block");
    auto& reps = flags.add_int("reps", 3, "timed blocks of each side, alternating");
    auto& launcher = flags.add_string("launcher", DPAR_LAUNCHER, "dpar-launch binary");
    auto& start_port =
        flags.add_int("start-port", 0, "first of 4 loopback ports (0: a free block)");
    auto& worker = flags.add_bool("worker", false, "internal: one process of the ps job");
    auto& result_dir = flags.add_string("result-dir", "", "internal: where trainers write");
    auto& raw_endpoints =
        flags.add_string("raw-endpoints", "", "internal: the bare gRPC servers' ip:port list");
    flags.parse(argc, argv);
    DPAR_CHECK(floats >= 8 && warmup >= 0 && iters >= 1 && reps >= 1,
               "bench_ps: --floats >= 8, --iters >= 1, --reps >= 1 and --warmup >= 0 please");
    set_num_threads(1);
    const Settings cfg{floats, warmup, iters, reps};
    if (!worker) return run_driver(cfg, launcher, start_port);
    const std::vector<std::string> endpoints = split_commas(raw_endpoints);
    if (ps::is_server()) return run_server(endpoints);
    DPAR_CHECK(ps::is_worker(), "bench_ps --worker: run it under dpar-launch --run_mode=ps");
    return run_trainer(cfg, endpoints, result_dir);
  });
}
