#pragma once
// The CPU caching allocator's large blocks, carved out of reserved address ranges (the scheme
// of PyTorch's "expandable segments"). A training step asks for a few large sizes in turn
// (MobileNetV3-small at batch 16: 14.4 MB for one layer's activation, then 4.8 MB twice for a
// later one): whole blocks cached by size held a block of every size, or, bounded, gave one
// back and mapped it again every step, paying its page faults. Split and merged, the same
// memory serves them in turn.
//
// Blocks were first cut from separately mapped segments of their request's size, which could
// not merge with each other: the free memory of a step ended up in many small segments (six
// free 1.8 MB ones, say) while a 14.4 MB request mapped a new one, and the allocator held 30%
// more than the step's peak in use. Here every block lies in one reserved range of address
// space, pages mapped only where blocks are: free neighbours merge across what were segment
// boundaries, a free block's pages can be given back on their own (the block becomes unmapped
// address space), and a request that no free block fits maps only the pages it lacks, across a
// run of free and unmapped blocks.
// Not thread-safe: the allocator calls it under its lock.
#include <cstddef>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dpar::detail {

class SegmentArena {
 public:
  SegmentArena() = default;
  SegmentArena(const SegmentArena&) = delete;
  SegmentArena& operator=(const SegmentArena&) = delete;
  ~SegmentArena();

  // A block of at least `size` bytes from the free block that fits best (the whole block where
  // less than kMinSplit would remain), or nullptr when none fits. `block` receives its size.
  void* take_cached(size_t size, size_t& block);
  // A block of block_size_for(size) bytes that maps new pages: the run of free and unmapped
  // blocks that needs the fewest, else a new range. nullptr when the system refuses.
  void* take_new(size_t size, size_t& block);
  // Whether p is a block this arena handed out and has not had back.
  bool owns(const void* p) const;
  // Frees the block at p, merging it with free neighbours; returns its size.
  size_t give_back(void* p);

  // The size of the largest free block (0 if none), and giving its pages back to the system.
  size_t largest_free_block() const;
  void release_largest_free_block();

  // Bytes in free blocks (mapped, so held).
  size_t free_bytes() const { return free_bytes_; }
  // The size of the block a request gets: whole pages, so that a block's pages can be given
  // back without touching its neighbours.
  static size_t block_size_for(size_t size);

  static constexpr size_t kMinSplit = size_t{256} << 10;

 private:
  enum class State : uint8_t { used, free, unmapped };
  struct Block {
    uint8_t* ptr;
    size_t size;
    State state;
    Block* prev;  // neighbours in the same range, by address
    Block* next;
  };
  // Where take_new maps: `size` bytes from `start`, which lies in block `first`; to_map of them
  // are unmapped.
  struct Window {
    Block* first = nullptr;
    uint8_t* start = nullptr;
    size_t to_map = SIZE_MAX;
  };

  Block* split(Block* b, size_t size);
  void absorb(Block* left, Block* right);
  void mark_free(Block* b);
  void unmark_free(Block* b);
  Block* merge_with_neighbours(Block* b);
  Window best_window(size_t size) const;
  bool add_range(size_t size);
  void* claim(const Window& w, size_t size);

  struct Range {
    uint8_t* base;
    size_t size;
  };
  std::vector<Range> ranges_;
  std::set<std::pair<size_t, uint8_t*>> free_by_size_;  // best fit: the smallest that fits
  std::unordered_map<const uint8_t*, Block*> blocks_;   // every block, by start
  size_t free_bytes_ = 0;
};

}  // namespace dpar::detail
