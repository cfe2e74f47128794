#include "model_check.h"

#include <algorithm>

namespace dpar::dist {
namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
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

// A fixed-size digest goes first so the common case costs one tiny all-gather; the full lists
// are exchanged only to explain a mismatch.
}  // namespace

std::string ModelSignature::serialized() const {
  std::string out;
  for (const auto& s : params) out += s + '\n';
  for (const auto& s : buffers) out += s + '\n';
  return out;
}

std::string describe_model_entry(const std::string& name, const std::string& dtype,
                                 const std::vector<int64_t>& shape, bool frozen) {
  std::string out = name + " " + dtype + shape_str(shape);
  if (frozen) out += " frozen";
  return out;
}

void verify_same_model(Group& group, const ModelSignature& mine) {
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

  const std::vector<std::string> texts = allgather_strings(group, text);
  std::vector<ModelSignature> all(world);
  for (int r = 0; r < world; ++r) {
    const auto d = digests[r].to_float_vector();
    std::string line;
    std::vector<std::string> lines;
    for (const char c : texts[r]) {
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

}  // namespace dpar::dist
