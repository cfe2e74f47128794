#include "tensor/cpu_segment_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <iterator>

namespace dpar::detail {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;
// Address space reserved at a time. Reserving costs no memory (PROT_NONE, no swap
// reservation), and blocks merge only within one range, so it is large; where the system
// refuses that much (a ulimit -v), the reservation halves down to what the request needs.
constexpr size_t kRangeBytes = size_t{64} << 30;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Transparent huge pages: Linux's default THP mode (madvise) backs only memory that asks, and
// with 4 KiB pages the streaming kernels and oneDNN's packing of large activations miss the TLB
// (ViT-Tiny's step ~1.5% faster on one core). The advice stays with the address range through
// mprotect; a range remapped PROT_NONE asks again.
void advise_huge_pages(uint8_t* p, size_t n) {
#ifdef MADV_HUGEPAGE
  ::madvise(p, n, MADV_HUGEPAGE);
#endif
}

// Pages that hold no memory: reading or writing them faults, and they need no swap reservation.
bool drop_pages(uint8_t* p, size_t n) {
  void* r = ::mmap(p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (r == MAP_FAILED) return false;
  advise_huge_pages(p, n);
  return true;
}

}  // namespace

SegmentArena::~SegmentArena() {
  for (const Range& r : ranges_) ::munmap(r.base, r.size);
  for (auto& [start, b] : blocks_) delete b;
}

size_t SegmentArena::block_size_for(size_t size) { return round_up(size, kPage); }

void SegmentArena::mark_free(Block* b) {
  b->state = State::free;
  free_by_size_.emplace(b->size, b->ptr);
  free_bytes_ += b->size;
}

void SegmentArena::unmark_free(Block* b) {
  free_by_size_.erase({b->size, b->ptr});
  free_bytes_ -= b->size;
}

// Cuts b (not in the free set) after its first `front` bytes; the back part, in b's state, is
// returned.
SegmentArena::Block* SegmentArena::split(Block* b, size_t front) {
  auto* back = new Block{b->ptr + front, b->size - front, b->state, b, b->next};
  if (b->next) b->next->prev = back;
  b->next = back;
  b->size = front;
  blocks_.emplace(back->ptr, back);
  return back;
}

// left absorbs its neighbour right (neither in the free set).
void SegmentArena::absorb(Block* left, Block* right) {
  left->size += right->size;
  left->next = right->next;
  if (left->next) left->next->prev = left;
  blocks_.erase(right->ptr);
  delete right;
}

// Merges b (not in the free set) with the neighbours in its state, free or unmapped, so that
// the range can serve larger requests again; returns the merged block.
SegmentArena::Block* SegmentArena::merge_with_neighbours(Block* b) {
  if (Block* next = b->next; next != nullptr && next->state == b->state) {
    if (next->state == State::free) unmark_free(next);
    absorb(b, next);
  }
  if (Block* prev = b->prev; prev != nullptr && prev->state == b->state) {
    if (prev->state == State::free) unmark_free(prev);
    absorb(prev, b);
    b = prev;
  }
  return b;
}

void* SegmentArena::take_cached(size_t size, size_t& block) {
  size = block_size_for(size);
  auto it = free_by_size_.lower_bound({size, nullptr});
  if (it == free_by_size_.end()) return nullptr;
  Block* b = blocks_.at(it->second);
  unmark_free(b);
  b->state = State::used;
  // The rest stays free where it is worth keeping apart. Its neighbour after is not free
  // (free neighbours are always merged), so it needs no merge.
  if (b->size - size >= kMinSplit) mark_free(split(b, size));
  block = b->size;
  return b->ptr;
}

// The window of `size` bytes among free and unmapped blocks that has the fewest unmapped
// bytes (the fewest pages to fault in), the lower address on a tie. Windows start at a block's
// start or end at a free block's end, so a free block is used from either side.
SegmentArena::Window SegmentArena::best_window(size_t size) const {
  Window best;
  auto consider = [&](Block* first, uint8_t* start) {
    size_t to_map = 0;
    const uint8_t* end = start + size;
    for (Block* q = first; q != nullptr && q->ptr < end; q = q->next) {
      if (q->state == State::used) return;
      if (q->state == State::unmapped) {
        to_map += static_cast<size_t>(std::min<const uint8_t*>(q->ptr + q->size, end) -
                                      std::max<const uint8_t*>(q->ptr, start));
      }
      if (q->next == nullptr && q->ptr + q->size < end) return;  // runs past the range
    }
    if (to_map < best.to_map || (to_map == best.to_map && start < best.start)) {
      best = {first, start, to_map};
    }
  };
  for (const Range& r : ranges_) {
    for (Block* b = blocks_.at(r.base); b != nullptr; b = b->next) {
      if (b->state == State::used) continue;
      consider(b, b->ptr);
      if (b->state != State::free || b->size >= size) continue;
      // Ending at b's end: starts in b or a block before it.
      uint8_t* start = b->ptr + b->size - size;
      if (start < r.base) continue;
      Block* first = b;
      while (first->ptr > start) first = first->prev;
      consider(first, start);
    }
  }
  return best;
}

bool SegmentArena::add_range(size_t size) {
  const size_t need = round_up(size, kHugePage);
  size_t length = std::max(kRangeBytes, need);
  void* raw = MAP_FAILED;
  while (true) {
    // One huge page more, so that the range can start on a 2 MiB boundary.
    raw = ::mmap(nullptr, length + kHugePage, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw != MAP_FAILED) break;
    if (length / 2 < need) return false;
    length /= 2;
  }
  auto* first = static_cast<uint8_t*>(raw);
  auto* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(first), kHugePage));
  if (base > first) ::munmap(first, static_cast<size_t>(base - first));
  if (uint8_t* end = base + length; end < first + length + kHugePage) {
    ::munmap(end, static_cast<size_t>(first + length + kHugePage - end));
  }
  advise_huge_pages(base, length);
  ranges_.push_back({base, length});
  blocks_.emplace(base, new Block{base, length, State::unmapped, nullptr, nullptr});
  return true;
}

// Maps the unmapped pages of window w and makes the window one used block.
void* SegmentArena::claim(const Window& w, size_t size) {
  uint8_t* const end = w.start + size;
  // The whole 2 MiB pages around the window become accessible, so that huge pages can back its
  // edges: the kernel uses one only where its whole extent is mapped when it is first touched,
  // and blocks placed one after another otherwise ended on 4 KiB pages (MobileNetV3-small's
  // step had 80 MB of huge pages against 116 MB with separately mapped segments). The margin
  // stays unmapped in the arena's books (no block holds it) and costs nothing until touched.
  // Ranges start and end on 2 MiB boundaries, so the margin stays inside the range. mprotect
  // leaves mapped pages as they are; on failure, what it may have mapped is dropped again.
  auto* lo =
      reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(w.start) / kHugePage * kHugePage);
  auto* hi = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(end), kHugePage));
  if (::mprotect(lo, static_cast<size_t>(hi - lo), PROT_READ | PROT_WRITE) != 0) {
    Block* q = w.first;
    while (q->prev != nullptr && q->ptr > lo) q = q->prev;
    for (; q != nullptr && q->ptr < hi; q = q->next) {
      if (q->state != State::unmapped) continue;
      uint8_t* from = std::max(q->ptr, lo);
      drop_pages(from, static_cast<size_t>(std::min(q->ptr + q->size, hi) - from));
    }
    return nullptr;
  }
  // Cut the blocks at the window's edges (the parts outside keep their state), then merge the
  // window into one block.
  auto leave_free_set = [&](Block* q) {
    if (q->state == State::free) unmark_free(q);
  };
  Block* b = w.first;
  leave_free_set(b);
  if (b->ptr < w.start) {
    Block* front = b;
    b = split(front, static_cast<size_t>(w.start - front->ptr));
    if (front->state == State::free) mark_free(front);
  }
  for (Block* q = b;; q = q->next) {
    if (q->ptr + q->size > end) {
      Block* back = split(q, static_cast<size_t>(end - q->ptr));
      if (back->state == State::free) mark_free(back);
    }
    if (q->ptr + q->size == end) break;
    leave_free_set(q->next);
  }
  b->state = State::used;
  while (b->ptr + b->size < end) absorb(b, b->next);
  return b->ptr;
}

void* SegmentArena::take_new(size_t size, size_t& block) {
  size = block_size_for(size);
  Window w = best_window(size);
  if (w.first == nullptr) {
    if (!add_range(size)) return nullptr;
    w = best_window(size);
  }
  void* p = claim(w, size);
  if (p != nullptr) block = size;
  return p;
}

bool SegmentArena::owns(const void* p) const {
  auto it = blocks_.find(static_cast<const uint8_t*>(p));
  return it != blocks_.end() && it->second->state == State::used;
}

size_t SegmentArena::give_back(void* p) {
  Block* b = blocks_.at(static_cast<const uint8_t*>(p));
  const size_t size = b->size;
  b->state = State::free;
  mark_free(merge_with_neighbours(b));
  return size;
}

size_t SegmentArena::largest_free_block() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void SegmentArena::release_largest_free_block() {
  if (free_by_size_.empty()) return;
  Block* b = blocks_.at(free_by_size_.rbegin()->second);
  unmark_free(b);
  if (!drop_pages(b->ptr, b->size)) {
    // Still mapped (the system refused the remapping, which does not happen in practice):
    // keep it as a free block rather than lose track of it.
    mark_free(b);
    return;
  }
  b->state = State::unmapped;
  merge_with_neighbours(b);
}

}  // namespace dpar::detail
