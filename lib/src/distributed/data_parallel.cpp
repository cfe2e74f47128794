#include "dpar/distributed/data_parallel.h"

#include <cstdio>

#include "dpar/autograd/grad_mode.h"
#include "dpar/distributed/parallel_env.h"
#include "reducer.h"

namespace dpar::dist {
namespace {

// "features.3.weight f32[24,16,1,1]" (+ " frozen" when it needs no gradient).
std::string describe(const std::string& name, const Tensor& t, bool parameter) {
  std::string out = name + " " + std::string(dtype_name(t.dtype())) + shape_str(t.shape());
  if (parameter && !t.requires_grad()) out += " frozen";
  return out;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

struct Signature {
  std::vector<std::string> params, buffers;
  std::string serialized() const {
    std::string out;
    for (const auto& s : params) out += s + '\n';
    for (const auto& s : buffers) out += s + '\n';
    return out;
  }
};

Signature signature_of(const nn::Module& m) {
  Signature s;
  for (const auto& [name, t] : m.named_parameters()) s.params.push_back(describe(name, t, true));
  for (const auto& [name, t] : m.named_buffers()) s.buffers.push_back(describe(name, t, false));
  return s;
}

// The first difference between rank 0's list and rank r's, or "" when equal.
std::string first_difference(const char* what, const std::vector<std::string>& a,
                             const std::vector<std::string>& b, int rank_b) {
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const bool in_a = i < a.size(), in_b = i < b.size();
    if (in_a && in_b && a[i] == b[i]) continue;
    auto side = [&](bool present, const std::vector<std::string>& list) {
      return present ? "has " + list[i]
                     : "has no " + std::string(what) + " " + std::to_string(i) + " (only " +
                           std::to_string(list.size()) + ")";
    };
    return std::string(what) + " " + std::to_string(i) + " differs across ranks: rank 0 " +
           side(in_a, a) + ", rank " + std::to_string(rank_b) + " " + side(in_b, b);
  }
  return {};
}

// Throws on every rank, with the same message, when the ranks' models differ. A fixed-size
// digest goes first so the common case costs one tiny all-gather; the full lists are
// exchanged only to explain a mismatch.
void verify_same_model(Group& group, const nn::Module& module) {
  const Signature mine = signature_of(module);
  const std::string text = mine.serialized();
  const uint64_t h = fnv1a(text);
  // 16-bit pieces: exact in f32, the dtype every backend reduces and gathers.
  std::vector<float> digest{static_cast<float>(mine.params.size()),
                            static_cast<float>(mine.buffers.size())};
  for (int k = 0; k < 4; ++k) digest.push_back(static_cast<float>((h >> (16 * k)) & 0xffff));
  const int world = group.size();
  auto gather = [&](const Tensor& input) {
    std::vector<Tensor> out;
    for (int r = 0; r < world; ++r) out.push_back(Tensor::empty(input.shape()));
    group.allgather(out, input, /*async_op=*/false);
    return out;
  };
  const auto digests = gather(Tensor::from_vector(digest, {static_cast<int64_t>(digest.size())}));
  bool same = true;
  for (int r = 1; r < world; ++r) {
    same = same && digests[r].to_float_vector() == digests[0].to_float_vector();
  }
  if (same) return;

  const auto lengths = gather(Tensor::full({1}, static_cast<double>(text.size())));
  int64_t longest = 1;
  for (const auto& l : lengths)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(l.item()));
  std::vector<float> bytes(static_cast<size_t>(longest), 0.f);
  for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  const auto texts = gather(Tensor::from_vector(bytes, {longest}));
  std::vector<Signature> all(world);
  for (int r = 0; r < world; ++r) {
    const auto d = digests[r].to_float_vector();
    const auto chars = texts[r].to_float_vector();
    std::string line;
    std::vector<std::string> lines;
    for (int64_t i = 0; i < static_cast<int64_t>(lengths[r].item()); ++i) {
      const char c = static_cast<char>(static_cast<unsigned char>(chars[i]));
      if (c == '\n') {
        lines.push_back(line);
        line.clear();
      } else {
        line += c;
      }
    }
    const size_t num_params = std::min(lines.size(), static_cast<size_t>(d[0]));
    all[r].params.assign(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(num_params));
    all[r].buffers.assign(lines.begin() + static_cast<std::ptrdiff_t>(num_params), lines.end());
  }
  for (int r = 1; r < world; ++r) {
    std::string diff = first_difference("parameter", all[0].params, all[r].params, r);
    if (diff.empty()) diff = first_difference("buffer", all[0].buffers, all[r].buffers, r);
    if (!diff.empty()) DPAR_FAIL("DataParallel: ", diff);
  }
  DPAR_FAIL(
      "DataParallel: the ranks' models differ (digests disagree) but no difference was "
      "found in their parameter and buffer lists");
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options)
    : Module("DataParallel"), module_(std::move(module)), options_(std::move(options)) {
  DPAR_CHECK(module_ != nullptr, "DataParallel: the module is null");
  DPAR_CHECK(options_.comm_buffer_size > 0 && options_.last_comm_buffer_size > 0,
             "DataParallel: comm_buffer_size (", options_.comm_buffer_size,
             " MB) and last_comm_buffer_size (", options_.last_comm_buffer_size,
             " MB) must be positive");
  DPAR_CHECK(options_.comm_dtype == DType::f32 || options_.comm_dtype == DType::bf16 ||
                 options_.comm_dtype == DType::f16,
             "DataParallel: comm_dtype must be f32, bf16 or f16, got ",
             dtype_name(options_.comm_dtype));
  // A child, so apply(), repr() and train() reach it; the overrides below drop the prefix.
  register_module("module", module_);
  Module::train(module_->is_training());
  if (!options_.group) {
    // Under a launcher (world size > 1 in the environment) a missing init_parallel_env() would
    // make every process train alone as rank 0 of 1: an error, as in PyTorch's DDP.
    require_init_under_launcher("DataParallel");
    options_.group = default_group_ptr();
  }
  // No group (a single process) or a world of one: nothing to synchronise, so a plain
  // wrapper whose gradients stay the module's own.
  if (!options_.group || options_.group->size() == 1) return;
  Group& group = *options_.group;

  try {
    verify_same_model(group, *module_);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.rfind("DataParallel: ", 0) == 0) throw;  // the mismatch itself
    DPAR_FAIL(
        "DataParallel's model check at construction (every rank must build its "
        "DataParallel): ",
        what);
  }
  std::vector<Tensor> state = module_->parameters();
  for (auto& b : module_->buffers()) state.push_back(b);
  broadcast_coalesced(group, state, 0,
                      "DataParallel's broadcast of rank 0's parameters and buffers at "
                      "construction (every rank must build its DataParallel)");

  nn::NamedTensors trainable;
  for (auto& [name, t] : module_->named_parameters()) {
    if (t.requires_grad()) trainable.emplace_back(name, t);
  }
  Reducer::Options ro;
  ro.first_bucket_mb = options_.last_comm_buffer_size;
  ro.bucket_mb = options_.comm_buffer_size;
  ro.find_unused_parameters = options_.find_unused_parameters;
  ro.comm_dtype = options_.comm_dtype;
  reducer_ = std::make_unique<Reducer>(std::move(trainable), options_.group, ro);
  if (group.rank() == 0) {
    std::printf("DataParallel: %s\n", bucket_summary().c_str());
    std::fflush(stdout);
  }
}

DataParallel::~DataParallel() = default;

Tensor DataParallel::forward(const Tensor& input) { return run_forward(input, -1); }

Tensor DataParallel::forward(const Tensor& input, int64_t local_batch_size) {
  DPAR_CHECK(local_batch_size >= 0, "DataParallel::forward: local batch size must be >= 0, got ",
             local_batch_size);
  return run_forward(input, local_batch_size);
}

Tensor DataParallel::run_forward(const Tensor& input, int64_t local_batch_size) {
  // A training-mode forward updates BN running statistics from the rank's own batch, so they
  // drift apart; rank 0's are the truth, as in DDP. They go out before every training forward
  // and before the first eval forward after one (evaluation then uses the statistics rank 0
  // checkpoints); later eval forwards change nothing and communicate nothing.
  const bool training = module_->is_training();
  if (reducer_ && options_.broadcast_buffers && (training || !buffers_in_sync_)) {
    std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty()) {
      broadcast_coalesced(*options_.group, buffers, 0,
                          "DataParallel's buffer broadcast before a forward (every rank must run "
                          "it; evaluate dp.module() on one rank, or set broadcast_buffers = "
                          "false)");
    }
  }
  buffers_in_sync_ = !training;
  if (reducer_) reducer_->prepare_forward(sync_enabled_, local_batch_size);
  Tensor output = module_->forward(input);
  if (reducer_) reducer_->after_forward(output);
  return output;
}

nn::NamedTensors DataParallel::named_parameters(bool recurse) const {
  return module_->named_parameters(recurse);
}
nn::NamedTensors DataParallel::named_buffers(bool recurse) const {
  return module_->named_buffers(recurse);
}
nn::NamedTensors DataParallel::state_dict() const { return module_->state_dict(); }
nn::LoadReport DataParallel::load_state_dict(const nn::NamedTensors& entries, bool strict) {
  return module_->load_state_dict(entries, strict);
}
nn::LoadReport DataParallel::compare_state_dict(const nn::NamedTensors& entries) const {
  return module_->compare_state_dict(entries);
}

std::vector<BucketInfo> DataParallel::buckets() const {
  return reducer_ ? reducer_->buckets() : std::vector<BucketInfo>{};
}

std::string DataParallel::bucket_summary() const {
  if (!reducer_) return "all_reduce tensors: 0 (a world of one: nothing to synchronise)";
  return format_bucket_summary(reducer_->buckets());
}

DataParallel::CommStats DataParallel::last_comm_stats() const {
  return reducer_ ? reducer_->last_comm_stats() : CommStats{};
}

DataParallel::NoSyncGuard::NoSyncGuard(DataParallel& dp) : dp_(dp), previous_(dp.sync_enabled_) {
  dp_.sync_enabled_ = false;
}

DataParallel::NoSyncGuard::~NoSyncGuard() { dp_.sync_enabled_ = previous_; }

}  // namespace dpar::dist
