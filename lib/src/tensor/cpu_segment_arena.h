#pragma once
// The CPU caching allocator's large blocks: carved out of mapped segments, split where a
// request leaves a usable remainder, and merged with their free neighbours when released (the
// scheme of PyTorch's CUDA caching allocator). A training step asks for a few large sizes in
// turn (MobileNetV3-small at batch 16: 14.4 MB for one layer's activation, then 4.8 MB twice
// for a later one): whole blocks cached by size held a block of every size, or, bounded, gave
// one back and mapped it again every step, paying its page faults (3 per step, ~14.4 MB
// zeroed and faulted each time). Split and merged, the same memory serves them in turn.
// Not thread-safe: the allocator calls it under its lock.
#include <cstddef>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>

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
  // A block of at least `size` bytes from a new segment of `size` rounded up to whole pages (on
  // a 2 MiB boundary, advised for transparent huge pages). nullptr when the system refuses the
  // mapping.
  void* take_new(size_t size, size_t& block);
  // Whether p is a block this arena handed out and has not had back.
  bool owns(const void* p) const;
  // Frees the block at p, merging it with free neighbours; returns its size.
  size_t give_back(void* p);

  // The size of the largest wholly free segment (0 if none), and unmapping it.
  size_t largest_free_segment() const;
  void release_largest_free_segment();

  size_t free_bytes() const { return free_bytes_; }
  static size_t segment_size_for(size_t size);

  static constexpr size_t kMinSplit = size_t{256} << 10;

 private:
  struct Block {
    uint8_t* ptr;
    size_t size;
    bool free;
    Block* prev;  // neighbours in the same segment, by address
    Block* next;
  };
  Block* carve(Block* b, size_t size);
  void absorb(Block* left, Block* right);
  void mark_free(Block* b);
  void unmark_free(Block* b);
  bool whole_segment(const Block* b) const { return b->prev == nullptr && b->next == nullptr; }

  std::set<std::pair<size_t, uint8_t*>> free_by_size_;  // best fit: the smallest that fits
  std::unordered_map<const uint8_t*, Block*> blocks_;   // every block, free or not, by start
  size_t free_bytes_ = 0;
};

}  // namespace dpar::detail
