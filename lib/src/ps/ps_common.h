#pragma once
// Internals shared by the parameter server and its client (lib/src/ps/*.cpp).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "dpar/ps/layout.h"
#include "ps.grpc.pb.h"

namespace dpar::ps::detail {

namespace rpc = dpar::rpc::ps;

// Metadata on every call. The token is a "-bin" header so any bytes are allowed.
inline constexpr char kTokenKey[] = "dpar-ps-token-bin";
inline constexpr char kTrainerKey[] = "dpar-trainer-id";

// Tensors are streamed in chunks of 1 MiB of f32: big enough that per-message overhead is
// small, small enough that the first bytes are applied while the rest is still in flight.
inline constexpr int64_t kChunkElements = int64_t{256} * 1024;
// Explicit message cap on both ends (a chunk plus headers fits with room to spare; the layout
// of a model with many parameters travels in Hello/Init headers).
inline constexpr int kMaxMessageBytes = 16 << 20;

// CRC-32C (ISA-L) of what a chunk message says: its offset, its bytes and the numbers of its
// header (Init: the resume step; Push: step, learning rate, weight; Pull: version). Layouts and
// names are checked against trainer 0's by the servers already; these are the fields a flipped
// bit would otherwise turn silently into different weights.
uint32_t chunk_checksum(const rpc::InitMessage& msg);
uint32_t chunk_checksum(const rpc::PushMessage& msg);
uint32_t chunk_checksum(const rpc::PullMessage& msg);

// The message of a DATA_LOSS failure: "<who>: <what> chunk at offset <o> (<n> bytes) failed its
// CRC-32C check (<got> != <expected>): the bytes were corrupted in transit".
std::string corrupted_chunk(const std::string& what, int64_t offset, size_t bytes, uint32_t got,
                            uint32_t expected);

rpc::Layout to_proto(const ShardLayout& layout);
ShardLayout from_proto(const rpc::Layout& layout);

// A channel to a server with dpar's message limits and keepalive settings.
std::shared_ptr<grpc::Channel> make_channel(const std::string& endpoint);

// "4 s", "1.5 s": durations in messages.
std::string seconds_text(std::chrono::milliseconds t);

// "sync" / "async" / "geo" mode settings compared between trainers: "" when equal, else what
// differs ("mode async vs sync").
std::string mode_difference(const rpc::ModeConfig& a, const rpc::ModeConfig& b);

}  // namespace dpar::ps::detail
