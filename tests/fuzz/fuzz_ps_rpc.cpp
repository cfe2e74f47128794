// The parameter server's request handlers, as a trainer (or anyone who can reach the port)
// calls them: a real ps::Server on loopback and a script of calls (see rpc_script.h), the
// streaming calls (Init, Push) carrying up to four messages each. Save is pointed at the
// fuzzer's scratch folder. Each input gets a fresh server.
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "dpar/ps/server.h"
#include "fuzz_util.h"
#include "ps/ps_common.h"
#include "rpc_script.h"

namespace {

namespace rpc = dpar::rpc::ps;
namespace d = dpar::ps::detail;
constexpr char kToken[] = "fuzz-token";

void identify(grpc::ClientContext& ctx, uint8_t flags) {
  // A sync pull or push that waits for other trainers ends at the deadline.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
  if (!(flags & 1)) ctx.AddMetadata(d::kTokenKey, flags & 2 ? "other-token" : kToken);
  if (!(flags & 4)) ctx.AddMetadata(d::kTrainerKey, std::to_string((flags >> 3) % 3));
}

template <class Message>
bool parse(Message& m, std::string_view bytes) {
  return m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

// A client stream of the messages packed in `bytes` (each prefixed by one length byte). Each
// message gets its correct checksum unless flag 0x80 is set: otherwise nearly every input would
// stop at the CRC check and the handlers behind it would go unfuzzed.
template <class Message, class Reply, class Open>
void stream(const dpar::fuzz::RpcCall& c, Open open) {
  grpc::ClientContext ctx;
  identify(ctx, c.flags);
  Reply rep;
  auto writer = open(&ctx, &rep);
  std::string_view rest = c.request;
  for (int i = 0; i < 4 && !rest.empty(); ++i) {
    const size_t len = std::min<size_t>(static_cast<uint8_t>(rest[0]), rest.size() - 1);
    Message m;
    if (!parse(m, rest.substr(1, len))) {
      rest.remove_prefix(1 + len);
      continue;
    }
    if (!(c.flags & 0x80)) m.set_crc32c(d::chunk_checksum(m));
    if (!writer->Write(m)) break;
    rest.remove_prefix(1 + len);
  }
  writer->WritesDone();
  (void)writer->Finish();
}

void run_script(rpc::ParameterServer::Stub& stub, const std::vector<dpar::fuzz::RpcCall>& script) {
  for (const auto& c : script) {
    grpc::ClientContext ctx;
    identify(ctx, c.flags);
    switch (c.method % 7) {
      case 0: {
        rpc::HelloRequest req;
        rpc::HelloReply rep;
        if (parse(req, c.request)) (void)stub.Hello(&ctx, req, &rep);
        break;
      }
      case 1:
        stream<rpc::InitMessage, rpc::InitReply>(
            c, [&](grpc::ClientContext* x, rpc::InitReply* r) { return stub.Init(x, r); });
        break;
      case 2:
        stream<rpc::PushMessage, rpc::PushReply>(
            c, [&](grpc::ClientContext* x, rpc::PushReply* r) { return stub.Push(x, r); });
        break;
      case 3: {
        rpc::PullRequest req;
        if (!parse(req, c.request)) break;
        auto reader = stub.Pull(&ctx, req);
        rpc::PullMessage m;
        while (reader->Read(&m)) {
        }
        (void)reader->Finish();
        break;
      }
      case 4: {
        rpc::SaveRequest req;
        rpc::SaveReply rep;
        if (!parse(req, c.request)) break;
        req.set_dir((dpar::fuzz::scratch_dir() / "ps-save").string());
        (void)stub.Save(&ctx, req, &rep);
        break;
      }
      case 5: {
        rpc::FinishRequest req;
        rpc::FinishReply rep;
        if (parse(req, c.request)) (void)stub.Finish(&ctx, req, &rep);
        break;
      }
      default: {
        rpc::PingRequest req;
        rpc::PingReply rep;
        (void)stub.Ping(&ctx, req, &rep);
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto script = dpar::fuzz::rpc_script(data, size, 12);
  dpar::ps::ServerOptions options;
  options.endpoint = "127.0.0.1:0";
  options.num_trainers = 2;
  options.job_token = kToken;
  options.timeout = std::chrono::milliseconds(200);
  options.log = [](const std::string&) {};
  // The handlers serve from construction; run() only watches the job's end and timeouts, which
  // would keep a failed job's server up two more seconds per input.
  dpar::ps::Server server(options);
  auto stub = rpc::ParameterServer::NewStub(d::make_channel(server.endpoint()));
  run_script(*stub, script);
  server.stop();
  return 0;
}
