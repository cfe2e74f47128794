#include "distributed/collective_check.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>

namespace dpar::dist::detail {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::Allreduce:
      return "allreduce";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::Allgather:
      return "allgather";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::Barrier:
      return "barrier";
  }
  return "collective";
}

namespace {

// FNV-1a over 64-bit words: cheap, and any change in any dimension changes the result.
void hash_mix(uint64_t& h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
}

bool has_reduce_op(CollectiveKind kind) {
  return kind == CollectiveKind::Allreduce || kind == CollectiveKind::ReduceScatter;
}

}  // namespace

std::string CollectiveInfo::describe() const {
  std::ostringstream os;
  os << collective_name(kind) << '(';
  if (kind != CollectiveKind::Barrier) {
    os << dtype_name(dtype) << shape_str(shape);
    if (ntensors > 1) os << " +" << (ntensors - 1) << " more, " << numel << " elements";
    if (has_reduce_op(kind) && reduce_op != ReduceOp::Sum) os << ", " << reduce_op_name(reduce_op);
    if (kind == CollectiveKind::Broadcast) os << ", root " << root;
  }
  os << ')';
  return os.str();
}

CollectiveInfo describe_call(CollectiveKind kind, const std::vector<Tensor>& tensors, ReduceOp op,
                             int root) {
  CollectiveInfo info;
  info.kind = kind;
  info.reduce_op = op;
  info.root = root;
  info.ntensors = static_cast<int>(tensors.size());
  uint64_t h = 14695981039346656037ull;
  for (const Tensor& t : tensors) {
    info.numel += t.numel();
    hash_mix(h, static_cast<uint64_t>(t.dim()));
    for (int64_t d : t.shape()) hash_mix(h, static_cast<uint64_t>(d));
  }
  info.shapes_hash = h;
  if (!tensors.empty()) {
    info.dtype = tensors[0].dtype();
    info.shape = tensors[0].shape();
  }
  return info;
}

Fingerprint make_fingerprint(const CollectiveInfo& info, int world_size) {
  Fingerprint fp;
  std::memset(&fp, 0, sizeof(fp));
  fp.seq = info.seq;
  fp.numel = info.numel;
  fp.shapes_hash = info.shapes_hash;
  fp.kind = static_cast<int32_t>(info.kind);
  fp.dtype = static_cast<int32_t>(info.dtype);
  fp.reduce_op = has_reduce_op(info.kind) ? static_cast<int32_t>(info.reduce_op) : 0;
  fp.root = info.kind == CollectiveKind::Broadcast ? info.root : 0;
  fp.ntensors = info.ntensors;
  fp.ndim = static_cast<int32_t>(info.shape.size());
  for (size_t i = 0; i < info.shape.size() && i < Fingerprint::kMaxDims; ++i) {
    fp.dims[i] = info.shape[i];
  }
  fp.world_size = world_size;
  // A barrier carries no tensors, so its dtype field must not depend on leftovers.
  if (info.kind == CollectiveKind::Barrier) fp.dtype = 0;
  return fp;
}

namespace {

CollectiveInfo info_from(const Fingerprint& fp) {
  CollectiveInfo info;
  info.kind = static_cast<CollectiveKind>(fp.kind);
  info.seq = fp.seq;
  info.dtype = static_cast<DType>(fp.dtype);
  info.reduce_op = static_cast<ReduceOp>(fp.reduce_op);
  info.root = fp.root;
  info.ntensors = fp.ntensors;
  info.numel = fp.numel;
  info.shapes_hash = fp.shapes_hash;
  const int n = std::min<int>(std::max(fp.ndim, 0), Fingerprint::kMaxDims);
  info.shape.assign(fp.dims, fp.dims + n);
  return info;
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.root == b.root &&
         a.ntensors == b.ntensors && a.numel == b.numel && a.shapes_hash == b.shapes_hash &&
         a.world_size == b.world_size;
}

}  // namespace

std::string describe(const Fingerprint& fp) { return info_from(fp).describe(); }

std::string find_mismatch(const std::vector<Fingerprint>& all) {
  if (all.empty()) return {};
  const Fingerprint& ref = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    const Fingerprint& fp = all[r];
    if (fp.seq == ref.seq && same_call(fp, ref)) continue;
    std::ostringstream os;
    std::string a = describe(ref);
    std::string b = describe(fp);
    // Equal text but different fingerprints: a later tensor's shape or the world size differs.
    std::string detail;
    if (a == b && fp.world_size != ref.world_size) {
      detail = " (world size " + std::to_string(ref.world_size) + " vs " +
               std::to_string(fp.world_size) + ")";
    } else if (a == b) {
      detail = " (the tensors' shapes differ)";
    }
    if (fp.seq == ref.seq) {
      os << "collective mismatch at #" << ref.seq << ": rank 0 called " << a << " but rank " << r
         << " called " << b << detail;
    } else {
      os << "collective mismatch: rank 0 is at #" << ref.seq << " " << a << " but rank " << r
         << " is at #" << fp.seq << " " << b << detail << " (a rank skipped or added a collective)";
    }
    return os.str();
  }
  return {};
}

std::string format_duration(Millis t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + " s";
  return std::to_string(t.count()) + " ms";
}

namespace {
std::atomic<bool> group_failed{false};
}  // namespace

void note_group_failed() { group_failed.store(true); }
bool any_group_failed() { return group_failed.load(); }

}  // namespace dpar::dist::detail
