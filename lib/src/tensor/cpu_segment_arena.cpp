#include "tensor/cpu_segment_arena.h"

#include <sys/mman.h>

#include <iterator>

namespace dpar::detail {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

// length bytes (a multiple of 4 KiB) starting on a 2 MiB boundary, its whole 2 MiB pages
// advised for transparent huge pages: Linux's default THP mode (madvise) backs only memory
// that asks, and with 4 KiB pages the streaming kernels and oneDNN's packing of large
// activations miss the TLB (ViT-Tiny's step ~1.5% faster on one core). No huge page reaches
// past the end; the tail stays on 4 KiB pages.
uint8_t* map_segment(size_t length) {
  const size_t reserve = length + kHugePage - kPage;
  void* raw = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto* base = static_cast<uint8_t*>(raw);
  auto* start = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) /
                                           kHugePage * kHugePage);
  if (start > base) ::munmap(base, static_cast<size_t>(start - base));
  if (uint8_t* end = start + length; end < base + reserve) {
    ::munmap(end, static_cast<size_t>(base + reserve - end));
  }
#ifdef MADV_HUGEPAGE
  if (length >= kHugePage) ::madvise(start, length / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  return start;
}

}  // namespace

SegmentArena::~SegmentArena() {
  for (auto& [start, b] : blocks_) {
    if (b->prev == nullptr) {
      size_t length = 0;
      for (const Block* p = b; p != nullptr; p = p->next) length += p->size;
      ::munmap(b->ptr, length);
    }
  }
  for (auto& [start, b] : blocks_) delete b;
}

size_t SegmentArena::segment_size_for(size_t size) { return (size + kPage - 1) / kPage * kPage; }

void SegmentArena::mark_free(Block* b) {
  b->free = true;
  free_by_size_.emplace(b->size, b->ptr);
  free_bytes_ += b->size;
}

void SegmentArena::unmark_free(Block* b) {
  b->free = false;
  free_by_size_.erase({b->size, b->ptr});
  free_bytes_ -= b->size;
}

// Hands out the front of the free block b (already unmarked): `size` bytes of it, and the rest
// as a free block of its own when that is worth keeping apart.
SegmentArena::Block* SegmentArena::carve(Block* b, size_t size) {
  if (b->size - size >= kMinSplit) {
    auto* rest = new Block{b->ptr + size, b->size - size, false, b, b->next};
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    blocks_.emplace(rest->ptr, rest);
    mark_free(rest);
  }
  return b;
}

void* SegmentArena::take_cached(size_t size, size_t& block) {
  auto it = free_by_size_.lower_bound({size, nullptr});
  if (it == free_by_size_.end()) return nullptr;
  Block* b = blocks_.at(it->second);
  unmark_free(b);
  carve(b, size);
  block = b->size;
  return b->ptr;
}

void* SegmentArena::take_new(size_t size, size_t& block) {
  const size_t length = segment_size_for(size);
  uint8_t* start = map_segment(length);
  if (start == nullptr) return nullptr;
  auto* b = new Block{start, length, false, nullptr, nullptr};
  blocks_.emplace(start, b);
  carve(b, size);
  block = b->size;
  return b->ptr;
}

bool SegmentArena::owns(const void* p) const {
  auto it = blocks_.find(static_cast<const uint8_t*>(p));
  return it != blocks_.end() && !it->second->free;
}

// left absorbs its neighbour right (neither marked free).
void SegmentArena::absorb(Block* left, Block* right) {
  left->size += right->size;
  left->next = right->next;
  if (left->next) left->next->prev = left;
  blocks_.erase(right->ptr);
  delete right;
}

size_t SegmentArena::give_back(void* p) {
  Block* b = blocks_.at(static_cast<const uint8_t*>(p));
  const size_t size = b->size;
  // Merge with the free neighbours, so that the segment can serve larger requests again.
  if (Block* next = b->next; next != nullptr && next->free) {
    unmark_free(next);
    absorb(b, next);
  }
  if (Block* prev = b->prev; prev != nullptr && prev->free) {
    unmark_free(prev);
    absorb(prev, b);
    b = prev;
  }
  mark_free(b);
  return size;
}

size_t SegmentArena::largest_free_segment() const {
  for (auto it = free_by_size_.rbegin(); it != free_by_size_.rend(); ++it) {
    if (whole_segment(blocks_.at(it->second))) return it->first;
  }
  return 0;
}

void SegmentArena::release_largest_free_segment() {
  for (auto it = free_by_size_.rbegin(); it != free_by_size_.rend(); ++it) {
    Block* b = blocks_.at(it->second);
    if (!whole_segment(b)) continue;
    unmark_free(b);
    ::munmap(b->ptr, b->size);
    blocks_.erase(b->ptr);
    delete b;
    return;
  }
}

}  // namespace dpar::detail
