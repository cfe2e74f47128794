#pragma once
// Turns a fuzz input into a script of RPCs for the store and parameter-server targets:
//   [method byte][flags byte][length: 2 bytes little-endian][request bytes] ...
// The method byte picks the call, the flags byte the identity the call presents (right, wrong
// or missing job token, rank/trainer id), and the bytes are parsed as the request message as
// the server would parse them off the wire (bytes protobuf rejects never reach a handler).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dpar::fuzz {

struct RpcCall {
  uint8_t method = 0;
  uint8_t flags = 0;
  std::string_view request;
};

inline std::vector<RpcCall> rpc_script(const uint8_t* data, size_t size, size_t max_calls) {
  std::vector<RpcCall> calls;
  size_t at = 0;
  while (at + 4 <= size && calls.size() < max_calls) {
    RpcCall call;
    call.method = data[at];
    call.flags = data[at + 1];
    const size_t len = data[at + 2] | (size_t{data[at + 3]} << 8);
    at += 4;
    const size_t take = len < size - at ? len : size - at;
    call.request = std::string_view(reinterpret_cast<const char*>(data + at), take);
    at += take;
    calls.push_back(call);
  }
  return calls;
}

}  // namespace dpar::fuzz
