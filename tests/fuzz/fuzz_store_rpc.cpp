// The rendezvous store's request handlers, as a peer on the network reaches them: a real
// StoreServer on loopback and a script of calls (see rpc_script.h) with any identity. Each
// input gets a fresh server, so the result depends on the input alone.
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "distributed/store_common.h"
#include "dpar/distributed/store.h"
#include "fuzz_util.h"
#include "rpc_script.h"
#include "store.grpc.pb.h"

namespace {

namespace rpc = dpar::rpc::store;
constexpr char kJob[] = "fuzz-job";
constexpr int kWorldSize = 2;

// Every call carries metadata as dpar's client sends it, unless the flags say otherwise.
void identify(grpc::ClientContext& ctx, uint8_t flags) {
  namespace d = dpar::dist::detail;
  // Blocking Get/Wait calls end at the deadline instead of the request's own timeout.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
  if (flags & 1) return;  // anonymous
  ctx.AddMetadata(d::kJobIdKey, flags & 2 ? std::string("other-job") : std::string(kJob));
  ctx.AddMetadata(d::kWorldSizeKey, flags & 4 ? "3" : std::to_string(kWorldSize));
  ctx.AddMetadata(d::kRankKey, std::to_string(flags >> 6));
}

template <class Request, class Reply, class Call>
void call(rpc::KeyValueStore::Stub& stub, const dpar::fuzz::RpcCall& c, Call method) {
  Request req;
  if (!req.ParseFromArray(c.request.data(), static_cast<int>(c.request.size()))) return;
  grpc::ClientContext ctx;
  identify(ctx, c.flags);
  Reply rep;
  (void)(stub.*method)(&ctx, req, &rep);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto script = dpar::fuzz::rpc_script(data, size, 16);
  dpar::dist::StoreServer server("127.0.0.1", 0, kJob, kWorldSize);
  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = rpc::KeyValueStore::NewStub(channel);
  using S = rpc::KeyValueStore::Stub;
  for (const auto& c : script) {
    switch (c.method % 7) {
      case 0:
        call<rpc::HelloRequest, rpc::HelloReply>(*stub, c, &S::Hello);
        break;
      case 1:
        call<rpc::SetRequest, rpc::SetReply>(*stub, c, &S::Set);
        break;
      case 2:
        call<rpc::GetRequest, rpc::GetReply>(*stub, c, &S::Get);
        break;
      case 3:
        call<rpc::AddRequest, rpc::AddReply>(*stub, c, &S::Add);
        break;
      case 4:
        call<rpc::CompareSetRequest, rpc::CompareSetReply>(*stub, c, &S::CompareSet);
        break;
      case 5:
        call<rpc::WaitRequest, rpc::WaitReply>(*stub, c, &S::Wait);
        break;
      default:
        call<rpc::CheckRequest, rpc::CheckReply>(*stub, c, &S::Check);
        break;
    }
  }
  server.shutdown();
  return 0;
}
