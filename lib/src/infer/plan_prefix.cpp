// Sub-batched prefix. A CNN's first layers work on its largest activations: MobileNetV3's
// stem writes 25.7 MB at batch 32 and its third block reads 32 MB, more than the last-level
// cache, so those layers stream from DRAM (the depthwise ones ~3x slower per image than at
// batch 1), while later layers, with smaller maps and larger weights, gain from the whole
// batch. So a plan for a batch whose first layers' working sets exceed the cache runs them on
// one image at a time, on a plan built for one image (sharing the weights), and copies each
// image's result at the cut into its own buffer for the whole batch; only the cut's value
// crosses it, so the rest runs unchanged. MobileNetV3-small at 224 px, batch 32, one core:
// ~48.5 -> ~44.3 ms (bench_infer, DPAR_INFER_SUB_BATCH=0 against the default), its first 9
// steps (up to the third block's depthwise convolution) image by image; the results are
// bitwise those of the whole-batch plan (test_infer_parity).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "infer/plan.h"
#include "infer/plan_util.h"

namespace dpar::infer::detail {

using dnnl::memory;

namespace {

// A core's own cache (L2) as the C library reports it, else 1 MiB. A layer whose working set
// for one image exceeds it is memory-bound at any batch; at batch N it needs N times that and
// streams from DRAM, while one image at a time keeps it in the caches (the last level's size
// is no guide: it is shared with other cores, and in a VM the reported size can be the host's).
size_t core_cache_bytes() {
  static const size_t bytes = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{1} << 20;
  }();
  return bytes;
}

// DPAR_INFER_SUB_BATCH=0 plans every step for the whole batch (to compare, or to measure).
bool sub_batching_enabled() {
  const char* env = std::getenv("DPAR_INFER_SUB_BATCH");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

// The prefix ends after the last step whose working set for one image (what it reads and
// writes) exceeds core_cache_bytes(), at the first point from there where a single value -
// produced inside the prefix - is all that later steps read of it. 0: no such point, or a step
// before it is not per-sample.
size_t Plan::prefix_cut() const {
  const int64_t batch = values_[static_cast<size_t>(program_.input)].dims[0];
  size_t last_big = 0;
  bool any_big = false;
  for (size_t i = 0; i < steps_.size() && steps_[i].per_sample; ++i) {
    const Step& s = steps_[i];
    size_t bytes = values_[static_cast<size_t>(s.dst)].md.get_size();
    for (int r : s.reads) bytes += values_[static_cast<size_t>(r)].md.get_size();
    if (bytes / static_cast<size_t>(batch) > core_cache_bytes()) {
      last_big = i;
      any_big = true;
    }
  }
  if (!any_big) return 0;
  std::set<int> produced{program_.input};
  for (size_t i = 0; i <= last_big; ++i) produced.insert(steps_[i].dst);
  for (size_t cut = last_big + 1; cut < steps_.size() && steps_[cut - 1].per_sample; ++cut) {
    produced.insert(steps_[cut - 1].dst);
    if (produced.count(program_.output)) return 0;
    std::set<int> crossing;
    for (size_t i = cut; i < steps_.size(); ++i) {
      for (int r : steps_[i].reads) {
        if (produced.count(r)) crossing.insert(r);
      }
      if (steps_[i].reuse >= 0 && produced.count(steps_[i].reuse)) crossing.insert(steps_[i].reuse);
    }
    if (crossing.size() == 1 && *crossing.begin() != program_.input) return cut;
  }
  return 0;
}

void Plan::plan_prefix(const Shape& input_dims) {
  const int64_t batch = input_dims.empty() ? 1 : input_dims[0];
  if (batch <= 1 || !sub_batching_enabled()) return;
  const size_t cut = prefix_cut();
  if (cut == 0) return;
  const int boundary = steps_[cut - 1].dst;
  Shape one = input_dims;
  one[0] = 1;
  std::unique_ptr<Plan> sub;
  try {
    sub = std::make_unique<Plan>(program_, weights_, one, boundary);
  } catch (const std::exception&) {
    return;  // e.g. a constant shaped for the whole batch: not per-image after all
  }
  // The one-image plan must compute the prefix the same way, ending in the same layout.
  if (sub->steps_.size() != cut) return;
  for (size_t i = 0; i < cut; ++i) {
    if (sub->steps_[i].dst != steps_[i].dst || sub->steps_[i].category != steps_[i].category) {
      return;
    }
  }
  const Value& mine = values_[static_cast<size_t>(boundary)];
  const Value& theirs = sub->values_[static_cast<size_t>(boundary)];
  if (theirs.qscale != mine.qscale ||
      theirs.md.get_size() * static_cast<size_t>(batch) != mine.md.get_size()) {
    return;
  }
  // Image n's part of the batch's value must be the one-image value's bytes at offset n * size:
  // the batch dimension outermost, with the same layout for the rest.
  {
    const dnnl_memory_desc_t& d = mine.md.data;
    const dnnl_memory_desc_t& e = theirs.md.data;
    if (d.format_kind != dnnl_blocked || e.format_kind != dnnl_blocked || d.ndims != e.ndims ||
        d.offset0 != 0 || e.offset0 != 0 ||
        d.format_desc.blocking.inner_nblks != e.format_desc.blocking.inner_nblks) {
      return;
    }
    for (int k = 1; k < d.ndims; ++k) {
      if (d.padded_dims[k] != e.padded_dims[k] ||
          d.format_desc.blocking.strides[k] != e.format_desc.blocking.strides[k]) {
        return;
      }
    }
    if (static_cast<size_t>(d.format_desc.blocking.strides[0]) *
            memory::data_type_size(mine.md.data_type()) !=
        theirs.md.get_size()) {
      return;
    }
  }
  prefix_plan_ = std::move(sub);
  prefix_steps_ = cut;
  boundary_ = boundary;
  // This plan's scratchpad now serves only the steps it runs.
  scratchpad_bytes_ = 0;
  for (size_t i = cut; i < steps_.size(); ++i) {
    scratchpad_bytes_ = std::max(scratchpad_bytes_, steps_[i].scratchpad_md.get_size());
  }
}

void Plan::run_prefix(const Tensor& input) {
  Plan& one = *prefix_plan_;
  const size_t batch = static_cast<size_t>(values_[static_cast<size_t>(program_.input)].dims[0]);
  const size_t image_bytes = static_cast<size_t>(input.numel()) * sizeof(float) / batch;
  const memory& out = one.values_[static_cast<size_t>(boundary_)].memory;
  const size_t out_bytes = out.get_desc().get_size();
  auto* dst = static_cast<char*>(values_[static_cast<size_t>(boundary_)].memory.get_data_handle());
  auto* src = static_cast<char*>(input.raw_data());
  for (size_t n = 0; n < batch; ++n) {
    for (memory& m : one.input_memories_) m.set_data_handle(src + n * image_bytes);
    one.run_steps(0, prefix_steps_);
    std::memcpy(dst + n * out_bytes, out.get_data_handle(), out_bytes);
  }
}

}  // namespace dpar::infer::detail
