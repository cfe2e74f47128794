#pragma once
// How dense parameters are spread over parameter servers.
//
// All parameters of the model, in parameter order, form one flat f32 vector of `total()`
// elements. That vector is cut into blocks of `block_size` elements (the last may be shorter)
// and each server gets a contiguous run of whole blocks, as many as an even split gives, so
// servers hold equal bytes up to one block. Blocks may span parameter boundaries: every
// server-side update is element-wise, so a parameter split over two servers behaves exactly as
// if it lived on one. A contiguous shard per server means a push or pull is one byte range per
// server, streamed straight from / into the parameters' own memory.
//
// The mapping is a pure function of (parameter names and sizes, server count, block size), so
// every trainer computes the same one; the servers compare each trainer's layout with trainer
// 0's at startup and name the first parameter that differs.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dpar::ps {

struct ParamSlot {
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;  // first element in the flat vector
};

struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

inline constexpr int64_t kDefaultBlockSize = 8192;

class ShardLayout {
 public:
  ShardLayout() = default;
  // params: (name, element count) in parameter order. Throws dpar::Error for num_servers < 1,
  // block_size < 1, a negative count or a duplicate name.
  ShardLayout(const std::vector<std::pair<std::string, int64_t>>& params, int num_servers,
              int64_t block_size = kDefaultBlockSize);

  const std::vector<ParamSlot>& params() const { return params_; }
  int num_servers() const { return num_servers_; }
  int64_t block_size() const { return block_size_; }
  int64_t total() const { return total_; }
  int64_t num_blocks() const { return (total_ + block_size_ - 1) / block_size_; }
  // Elements of the flat vector server s holds. Empty when there are fewer blocks than servers.
  ElementRange shard(int server) const;
  // "" when both layouts are the same; else one line naming the first difference.
  std::string first_difference(const ShardLayout& other) const;
  // "2542856 floats (9.7 MB) in 311 blocks of 8192 over 2 servers: [0, 1277952) [1277952, ...)"
  std::string describe() const;

 private:
  std::vector<ParamSlot> params_;
  int num_servers_ = 1;
  int64_t block_size_ = kDefaultBlockSize;
  int64_t total_ = 0;
};

}  // namespace dpar::ps
