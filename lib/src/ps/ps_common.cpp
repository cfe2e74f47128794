#include "ps/ps_common.h"

#include <cstdio>
#include <cstring>

#include "core/crc32c.h"

namespace dpar::ps::detail {
namespace {

using dpar::detail::Crc32c;

Crc32c chunk_crc(int64_t offset, const std::string& data) {
  Crc32c crc;
  crc.add_value(offset).add(data.data(), data.size());
  return crc;
}

}  // namespace

uint32_t chunk_checksum(const rpc::InitMessage& msg) {
  return chunk_crc(msg.offset(), msg.data()).add_value(msg.header().resume_step()).value();
}

uint32_t chunk_checksum(const rpc::PushMessage& msg) {
  const rpc::PushHeader& h = msg.header();
  return chunk_crc(msg.offset(), msg.data())
      .add_value(h.step())
      .add_value(h.lr())
      .add_value(h.weight())
      .value();
}

uint32_t chunk_checksum(const rpc::PullMessage& msg) {
  return chunk_crc(msg.offset(), msg.data()).add_value(msg.version()).value();
}

std::string corrupted_chunk(const std::string& what, int64_t offset, size_t bytes, uint32_t got,
                            uint32_t expected) {
  return what + " chunk at offset " + std::to_string(offset) + " (" + std::to_string(bytes) +
         " bytes) failed its CRC-32C check (" + dpar::detail::crc_pair(got, expected) +
         "): the bytes were corrupted in transit";
}

rpc::Layout to_proto(const ShardLayout& layout) {
  rpc::Layout out;
  for (const ParamSlot& p : layout.params()) {
    rpc::ParamSpec* spec = out.add_params();
    spec->set_name(p.name);
    spec->set_numel(p.numel);
  }
  out.set_block_size(layout.block_size());
  out.set_num_servers(layout.num_servers());
  return out;
}

ShardLayout from_proto(const rpc::Layout& layout) {
  std::vector<std::pair<std::string, int64_t>> params;
  params.reserve(static_cast<size_t>(layout.params_size()));
  for (const rpc::ParamSpec& p : layout.params()) params.emplace_back(p.name(), p.numel());
  return ShardLayout(params, layout.num_servers(), layout.block_size());
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& endpoint) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Ping idle connections so a vanished server is noticed during long waits (sync pulls).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly while the servers start (the trainer's own loop bounds the total wait).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Each trainer gets its own connection per server instead of sharing a subchannel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
}

std::string seconds_text(std::chrono::milliseconds t) {
  const double s = static_cast<double>(t.count()) / 1000.0;
  char buf[32];
  std::snprintf(buf, sizeof buf,
                s == static_cast<double>(static_cast<int64_t>(s)) ? "%.0f s" : "%.1f s", s);
  return buf;
}

std::string mode_difference(const rpc::ModeConfig& a, const rpc::ModeConfig& b) {
  if (a.mode() != b.mode()) return "mode " + b.mode() + " instead of " + a.mode();
  if (a.num_trainers() != b.num_trainers()) {
    return std::to_string(b.num_trainers()) + " trainers instead of " +
           std::to_string(a.num_trainers());
  }
  if (a.mode() == "async" && a.max_staleness() != b.max_staleness()) {
    return "max staleness " + std::to_string(b.max_staleness()) + " instead of " +
           std::to_string(a.max_staleness());
  }
  if (a.mode() == "geo" && a.geo_k_steps() != b.geo_k_steps()) {
    return "geo k steps " + std::to_string(b.geo_k_steps()) + " instead of " +
           std::to_string(a.geo_k_steps());
  }
  return "";
}

}  // namespace dpar::ps::detail
